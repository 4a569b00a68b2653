"""Presets: each ``<name>.yaml`` here holds the settings of one ``splat-train <name>`` subcommand
that differ from the defaults in ``trainer/config.py``."""

from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent


def preset_names() -> list[str]:
    """Names of the presets shipped with the package, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """Path of preset ``name``; raises ValueError listing the presets when there is none."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; choose one of {preset_names()}")
    return path
