"""docs/flags.md is generated from the config tree (scripts/flag_reference.py) and kept current."""

import dataclasses
import typing

from splat_train.scripts import flag_reference
from splat_train.trainer.config import Config


def test_flags_md_is_current():
    assert flag_reference.DOC.read_text() == flag_reference.markdown(), (
        "docs/flags.md is stale: run python -m splat_train.scripts.flag_reference"
    )


def test_every_field_has_a_row():
    """Each leaf field of Config is one flag of the reference, under its own spelling."""

    def leaves(cls):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from leaves(hints[f.name])
            else:
                yield f.name

    rows = {f.names[0] for f in flag_reference.flags()}
    assert rows == {f"--{name}" for name in leaves(Config)}


def test_check_flags_stale_page(tmp_path, monkeypatch):
    stale = tmp_path / "flags.md"
    stale.write_text("# Flags\n")
    monkeypatch.setattr(flag_reference, "DOC", stale)
    assert flag_reference.main(["--check"]) == 1
    assert flag_reference.main([]) == 0
    assert flag_reference.main(["--check"]) == 0
    assert stale.read_text() == flag_reference.markdown()
