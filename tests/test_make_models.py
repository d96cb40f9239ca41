"""common/models/make_tiny_model.py writes where the user says and never replaces a model without --overwrite."""
import pytest

from common.models import make_tiny_model


def test_existing_output_folder_is_refused_in_one_line(tmp_path):
    out = tmp_path / "my_tiny_model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exc:
        make_tiny_model.main(["--out", str(out)])
    msg = str(exc.value.code)
    assert msg.startswith(f"error: --out {out} already exists") and "--overwrite" in msg and "\n" not in msg
    assert (out / "config.json").read_text() == "{}"  # untouched


def test_default_output_is_outside_common(capsys):
    with pytest.raises(SystemExit):
        make_tiny_model.main(["--help"])
    assert "(default: runs/tiny_model)" in " ".join(capsys.readouterr().out.split())
