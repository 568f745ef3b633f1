"""``ragmesh config``: every RAGMESH_* setting with its section, default and description."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def settings_rows() -> list[dict[str, Any]]:
    """Every RAGMESH_* setting with its section, default and description, in the order of
    meshkit.settings.SETTINGS_CLASSES; fields are listed under the class that introduces them."""
    from meshkit import settings as settings_module

    classes = settings_module.SETTINGS_CLASSES
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for cls in classes:
        for name, info in cls.model_fields.items():
            if name in seen:
                continue
            seen.add(name)
            env = f"{settings_module.ENV_PREFIX}{name.upper()}"
            current = os.environ.get(env)
            if current is not None and info.repr is False:
                current = "<set>"  # never echo a secret
            rows.append(
                {
                    "section": cls.__name__,
                    "env": env,
                    "default": info.get_default(call_default_factory=True, validated_data={}),
                    "description": info.description or "",
                    "value": current,
                }
            )
    return rows


def cmd_calibration() -> int:
    """The models' calibration the gateway would run with here, as the JSON a calibration file
    holds (meshkit.settings.model_calibration): these numbers are not settings."""
    from meshkit.settings import GatewaySettings
    from meshkit.settings.model_calibration import ModelCalibrationError

    settings = GatewaySettings()
    try:
        print(settings.calibration.to_json())
    except ModelCalibrationError as exc:
        raise ValueError(str(exc)) from None
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    if getattr(args, "calibration", False):
        return cmd_calibration()
    rows = settings_rows()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    section = None
    for row in rows:
        if row["section"] != section:
            section = row["section"]
            print(f"\n# {section}" if section != rows[0]["section"] else f"# {section}")
        value = row["default"]
        # As an operator would write it in the env: plain strings and paths, JSON booleans, empty for none.
        default = "" if value is None else str(value) if isinstance(value, str | Path) else json.dumps(value)
        current = f"  [set: {row['value']}]" if row["value"] is not None else ""
        print(f"{row['env']}={default}  # {row['description']}{current}")
    return 0
