"""Import the deployment scripts (deploy/k8s/*.py are run as files, not installed as a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def load_deploy_module(relative: str) -> ModuleType:
    """deploy/k8s/<relative>.py as a module (e.g. "check_manifests", "base/s3/users").
    check_manifests.py imports its sibling modules (manifest_*.py) as it does when it runs as a
    file, from deploy/k8s on the path."""
    name = "ragmesh_deploy_" + relative.replace("/", "_")
    if str(DEPLOY) not in sys.path:
        sys.path.insert(0, str(DEPLOY))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DEPLOY / f"{relative}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
