"""pyproject.toml: every package directory ships, the base install is torch + triton only, and the
extras that install a runtime stack (cute, cu13, cudnn) pin every package exactly."""

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


# Extras of tools (test runner, chart) may float; every extra that installs a runtime stack must be exact.
_TOOL_EXTRAS = {"test", "bench"}


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _split(requirement: str):
    """``"name[extra]==1.0; marker"`` -> ``("name", "==1.0")`` (name lower-cased, extras dropped)."""
    import re

    req = requirement.split(";")[0].strip()
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", req)
    assert m, requirement
    return m.group(1).lower(), m.group(3).strip()


def test_base_install_is_torch_and_triton_only():
    names = sorted(_split(r)[0] for r in _project()["dependencies"])
    assert names == ["torch", "triton"], f"base dependencies must be exactly torch + triton, got {names}"


def test_every_stack_extra_pin_is_exact():
    extras = _project()["optional-dependencies"]
    assert {"cute", "cu13", "cudnn"} <= set(extras), sorted(extras)
    for extra, reqs in extras.items():
        if extra in _TOOL_EXTRAS:
            continue
        assert reqs, f"extra {extra!r} is empty"
        for r in reqs:
            name, spec = _split(r)
            assert spec.startswith("==") and "," not in spec, f"extra {extra!r}: {r!r} is not pinned with =="


def test_cute_extras_carry_the_adapters_pins():
    from fastvideo_cute.adapters.fa4 import FA4_PINS

    extras = _project()["optional-dependencies"]
    for extra in ("cute", "cu13"):
        pins = dict(_split(r) for r in extras[extra])
        assert pins == {n: f"=={v}" for n, v in FA4_PINS.items()}, (extra, pins)
    cudnn = dict(_split(r) for r in extras["cudnn"])
    # cudnn-frontend 1.32.0 requires nvidia-cutlass-dsl[cu13]>=4.8.0: held at the CuTe stack's pin.
    assert cudnn == {"nvidia-cudnn-frontend": "==1.32.0",
                     "nvidia-cutlass-dsl": f"=={FA4_PINS['nvidia-cutlass-dsl']}"}, cudnn
