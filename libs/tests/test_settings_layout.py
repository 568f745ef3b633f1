"""meshkit.settings as a package, one module per service: every settings class defined in it is
exported and listed by ``ragmesh config``, each field once, and the paths its defaults compute
from the package's location still point at real files."""

from __future__ import annotations

import importlib
import pkgutil

from meshkit import settings
from meshkit.settings import MeshSettings
from ragmesh_cli.config import settings_rows


def defined_classes() -> list[type[MeshSettings]]:
    """Every MeshSettings subclass defined in a module of the package, found by walking it."""
    found: list[type[MeshSettings]] = []
    for info in pkgutil.iter_modules(settings.__path__, f"{settings.__name__}."):
        module = importlib.import_module(info.name)
        found += [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, MeshSettings) and obj.__module__ == info.name
        ]
    return found


def test_every_class_is_exported_and_listed() -> None:
    classes = defined_classes()
    assert len(classes) >= 13
    assert len(set(settings.SETTINGS_CLASSES)) == len(settings.SETTINGS_CLASSES)
    assert set(classes) == set(settings.SETTINGS_CLASSES)
    assert settings.SETTINGS_CLASSES[0] is MeshSettings
    for cls in classes:
        assert getattr(settings, cls.__name__) is cls, cls


def test_config_lists_every_field_once() -> None:
    rows = settings_rows()
    envs = [row["env"] for row in rows]
    assert len(envs) == len(set(envs))
    fields = {name for cls in defined_classes() for name in cls.model_fields}
    assert set(envs) == {f"{settings.ENV_PREFIX}{name.upper()}" for name in fields}
    # A field is listed under the first class that has it: the common block's under MeshSettings.
    sections = {row["env"]: row["section"] for row in rows}
    assert sections["RAGMESH_PORT"] == "MeshSettings"
    assert sections["RAGMESH_GATEWAY_ADDRESS"] == "MeshSettings"


def test_each_service_module_is_small() -> None:
    for info in pkgutil.iter_modules(settings.__path__, f"{settings.__name__}."):
        module = importlib.import_module(info.name)
        assert module.__file__ is not None
        with open(module.__file__, encoding="utf-8") as handle:
            assert sum(1 for _ in handle) <= 250, info.name


def test_the_default_reranker_model_dir_is_the_committed_one() -> None:
    """The path is computed from the module's own location, one level deeper since the split."""
    default = settings.RerankerSettings.model_fields["reranker_model_dir"].default
    assert default == settings.DEFAULT_RERANKER_MODEL_DIR
    assert (default / "manifest.json").is_file()
    assert (default / "model.onnx").is_file()
