"""The command line is a contract: every flag's spellings (aliases included), metavar, help text
and default, per preset, equal the recorded tests/data/cli_flags.json. Regrouping the config tree
into sections (trainer/config.py) must leave all of it as it was; a flag changed on purpose is
recorded again with ``SPLAT_RECORD_CLI_FLAGS=1 python -m pytest tests/test_cli_flags.py``."""

import json
import os
from pathlib import Path

import pytest

from splat_train.configs import preset_names
from splat_train.scripts.flag_reference import parser

RECORD = Path(__file__).resolve().parent / "data" / "cli_flags.json"


def contract(preset: str) -> dict[str, list]:
    """{the flag's spellings in the parser's order, space-separated: [metavar, help with its
    default]} of ``splat-train <preset>`` (tyro's parser; the section a flag sits in is left out),
    and under "" the command's description."""
    p = parser(preset)
    flags = {
        " ".join(a.option_strings): [a.metavar if isinstance(a.metavar, str) else None, a.help] for a in p._actions
    }
    return {"": [None, p.description], **flags}


def _record() -> dict:
    """The default preset in full; each other preset as the entries that differ from it."""
    base = contract("default")
    out: dict = {"default": base}
    for preset in preset_names():
        if preset != "default":
            out[preset] = {k: v for k, v in contract(preset).items() if base.get(k) != v}
    return out


def test_flags_equal_the_record():
    current = _record()
    if os.environ.get("SPLAT_RECORD_CLI_FLAGS"):
        RECORD.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(RECORD.read_text())
    assert sorted(current) == sorted(recorded)  # the presets
    for preset in recorded:
        missing = sorted(set(recorded[preset]) - set(current[preset]))
        added = sorted(set(current[preset]) - set(recorded[preset]))
        assert not missing and not added, f"{preset}: flags gone {missing}, flags new {added}"
        changed = [k for k in recorded[preset] if recorded[preset][k] != current[preset][k]]
        assert not changed, f"{preset}: metavar or help/default changed for {changed}"


@pytest.mark.parametrize("flag", ["--max_steps", "--data_dir", "--strategy.grow_grad2d", "--tb_every", "--seed"])
def test_record_holds_flat_flags(flag):
    """The record is of the flat command line (no section prefix such as --schedule.)."""
    recorded = json.loads(RECORD.read_text())["default"]
    assert recorded[""][1].startswith("A splat-train run.")
    names = {n for key in recorded for n in key.split()}
    assert flag in names
    assert not any(n.startswith(("--schedule.", "--data.", "--step.", "--outputs.")) for n in names)
