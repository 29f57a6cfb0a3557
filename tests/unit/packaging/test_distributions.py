"""The three distributions this repository builds (docs/install.md, "Distributions"):
agentq (operator/, the product: the image holds it), agentq-agent (sdk/, the agent
SDK, standard library only) and agentq-dev (tools/, the control plane, demo,
simulator and test doubles). Built from a copy of the sources as the Dockerfile
sees them; the SDK is then installed alone into a clean virtualenv and passes its
own tests there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

import agentq

ROOT = Path(__file__).resolve().parents[3]
# distribution -> (project directory, source root of its part of the agentq package)
PROJECTS = {
    "agentq": (".", "operator"),
    "agentq-agent": ("sdk", "sdk/src"),
    "agentq-dev": ("tools", "tools/src"),
}
DEV_MODULES = {"controlplane", "demo", "simulation", "scripted_agent", "holder", "release"}
SDK_MODULES = {"agent", "fencing"}


def _copy_sources(dest: Path) -> Path:
    """The projects' files (no caches, no build leftovers), so that building leaves the
    checkout as it was."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "tests")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for project, source in PROJECTS.values():
        (dest / project).mkdir(parents=True, exist_ok=True)
        for name in ("pyproject.toml", "README.md"):
            if project != "." and (ROOT / project / name).exists():
                shutil.copy2(ROOT / project / name, dest / project / name)
        shutil.copytree(ROOT / source / "agentq", dest / source / "agentq", ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """distribution -> its wheel, built with the pinned backend installed here (offline)."""
    src = _copy_sources(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), *(str(src / project) for project, _ in PROJECTS.values())],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    built = {p.name.split("-")[0].replace("_", "-"): p for p in out.glob("*.whl")}
    assert set(built) == set(PROJECTS)
    return built


def _files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if not n.split("/")[0].endswith(".dist-info")}


def _metadata(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = HeaderParser().parsestr(zf.read(name).decode())
    return meta["Version"], meta.get_all("Requires-Dist") or []


def _top(files: set[str]) -> set[str]:
    """The agentq modules a wheel holds: agentq/x.py and agentq/x/... -> x."""
    return {f.split("/")[1].removesuffix(".py") for f in files if f.count("/") >= 1}


def test_each_file_is_in_one_wheel_and_the_product_holds_no_dev_tools(
    wheels: dict[str, Path],
) -> None:
    files = {dist: _files(wheel) for dist, wheel in wheels.items()}
    product, sdk, dev = files["agentq"], files["agentq-agent"], files["agentq-dev"]
    assert not (product & sdk) and not (product & dev) and not (sdk & dev)
    assert _top(sdk) == SDK_MODULES  # and no agentq/__init__.py: a namespace alone
    assert _top(dev) == DEV_MODULES
    assert not _top(product) & (DEV_MODULES | SDK_MODULES)
    assert {"agentq/__init__.py", "agentq/operator/main.py", "agentq/agentsim.py"} <= product
    # Nothing lost: every source file is in its project's wheel.
    for dist, (_, source) in PROJECTS.items():
        base = ROOT / source
        sources = {
            str(p.relative_to(base))
            for p in (base / "agentq").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
        }
        assert sources == files[dist], dist


def test_the_versions_agree_and_the_sdk_depends_on_nothing(wheels: dict[str, Path]) -> None:
    meta = {dist: _metadata(wheel) for dist, wheel in wheels.items()}
    assert {version for version, _ in meta.values()} == {agentq.__version__}
    assert f"agentq-agent=={agentq.__version__}" in meta["agentq"][1]
    assert f"agentq=={agentq.__version__}" in meta["agentq-dev"][1]
    # Only extras: psycopg for the PostgreSQL store, kubernetes for the ConfigMap store.
    sdk_requires = meta["agentq-agent"][1]
    assert sdk_requires and all("extra ==" in r for r in sdk_requires), sdk_requires
    # The control plane's certificate library is a dev dependency, not the image's.
    assert not any(r.startswith("cryptography") for r in meta["agentq"][1])


def test_the_import_contract_names_every_module_of_the_three_parts() -> None:
    """The import-linter contract keeping the product off the dev tools lists modules by
    hand: a module added to a part must be added there too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["forbidden_modules"] and "agentq.controlplane" in c["forbidden_modules"]
        and "agentq.sidecar" in c["source_modules"]
    )  # fmt: skip

    def modules(source: str) -> set[str]:
        base = ROOT / source / "agentq"
        return {
            f"agentq.{p.name.removesuffix('.py')}"
            for p in base.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py")
            or (p.is_dir() and (p / "__init__.py").exists())
        }

    assert set(contract["source_modules"]) == modules("operator") | modules("sdk/src")
    assert set(contract["forbidden_modules"]) == modules("tools/src")


@pytest.mark.slow  # ~20 s: a virtualenv, pytest installed (PyPI, or pip's cache), the tests
def test_the_sdk_installs_alone_in_a_clean_virtualenv_and_passes_its_tests(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300,
            check=check, env={"PATH": "/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )  # fmt: skip

    # --no-index: had it a dependency, the install would fail here.
    run("-m", "pip", "install", "--quiet", "--no-index", str(wheels["agentq-agent"]))
    listed = json.loads(run("-m", "pip", "list", "--format=json").stdout)
    installers = {"pip", "setuptools"}  # what python -m venv puts in every virtualenv
    assert {p["name"] for p in listed} - installers == {"agentq-agent"}, listed

    probe = run(
        "-c",
        "import sys, agentq, agentq.agent, agentq.fencing\n"
        "store = agentq.fencing.open_store('sqlite://' + sys.argv[1])\n"
        "store.write('t', 2, {'a': 1})\n"
        "try:\n"
        "    store.write('t', 1, {'a': 0})\n"
        "except agentq.fencing.StaleTokenError:\n"
        "    print('refused')\n"
        "print(agentq.__file__, agentq.agent.SidecarClient.__name__)\n"
        "for name in ('kubernetes', 'psycopg', 'click', 'aiohttp', 'agentq.protocol'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ModuleNotFoundError:\n"
        "        print('absent', name)\n",
        str(tmp_path / "results.db"),
    )
    assert probe.stdout.split("\n")[:2] == ["refused", "None SidecarClient"], probe.stdout
    assert probe.stdout.count("absent") == 5, probe.stdout

    # The SDK's own tests, with pytest (the version this checkout pins) and nothing else.
    pin = next(
        r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"]["test"] if r.startswith("pytest==")
    )  # fmt: skip
    run("-m", "pip", "install", "--quiet", pin)
    tests = tmp_path / "sdk"
    shutil.copytree(
        ROOT / "sdk" / "tests", tests / "tests", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(ROOT / "sdk" / "pyproject.toml", tests / "pyproject.toml")
    done = run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests / "tests"), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_the_dev_commands_come_from_agentq_dev_and_say_so_when_it_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from agentq import cli

    # Here (make venv) agentq-dev is installed: its entry points add the commands.
    assert {"cluster", "simulate"} <= set(cli._plugins())
    assert CliRunner().invoke(cli.main, ["cluster", "--help"]).exit_code == 0
    # As in the image: the product alone.
    monkeypatch.setattr(cli, "_plugins", dict)
    for command in ("cluster", "simulate"):
        done = CliRunner().invoke(cli.main, [command, "up"])
        assert done.exit_code == 2
        assert "comes with agentq-dev" in done.output and "make venv" in done.output
    assert "cluster" not in CliRunner().invoke(cli.main, ["--help"]).output
