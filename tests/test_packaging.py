"""Every package directory ships: pyproject's explicit package list must name them all."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_dir_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg.get("package-dir", {})
    found = set()
    assert not mapping, f"the source tree is the import tree: no package-dir mapping, got {mapping}"
    assert not (ROOT / "kernels").exists(), "kernels/ lives inside the package (fastvideo_cute/kernels)"
    for init in (ROOT / "fastvideo_cute").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT).parts
        found.add(".".join(rel))
    missing = found - listed
    assert not missing, f"package directories missing from pyproject.toml: {sorted(missing)}"


def test_console_scripts_point_at_real_modules():
    import importlib.util

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("scripts", {})
    for target in scripts.values():
        module = target.split(":")[0]
        assert importlib.util.find_spec(module) is not None, target
