"""A new user's first hour, in a copy of the repository with nothing beside it (no sibling folders):
the README's demo, its quick start under etrun, and every command block in docs/ fenced as
```` ```bash runnable ````, each exiting 0. The copy's own code is imported (PYTHONPATH), the
installed venv supplies the dependencies."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _copy_repo(dest: Path) -> Path:
    """The files a clone has: tracked and untracked-but-not-ignored ones."""
    try:
        names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        names = None
    repo = dest / "elastictrain"
    if names is None:  # not a git checkout (an unpacked archive): everything but build outputs
        shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".venv", "runs", ".git", "__pycache__"))
        return repo
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / name)
    return repo


def _env(repo: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(str(repo / p) for p in (".", "integrations/torch", "integrations/tf",
                                                                       "integrations/torchx"))
    for var in ("ET_COORDINATOR", "ET_TOKEN_FILE", "ET_TOKEN"):
        env.pop(var, None)
    return env


def _runnable_blocks() -> list[tuple[str, str]]:
    blocks = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, body in enumerate(re.findall(r"^```(?:bash|sh) runnable\n(.*?)^```", doc.read_text(), re.S | re.M)):
            blocks.append((f"{doc.name}#{i + 1}", body))
    return blocks


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("first-hour")
    repo = _copy_repo(base)
    assert not (base / "shared").exists() and not (repo.parent / "shared").exists()
    return repo


def _run(cmd, repo, timeout, **kw):
    r = subprocess.run(cmd, cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{cmd!r} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def test_the_copy_imports_its_own_code(repo):
    r = _run([sys.executable, "-c", "import elastictrain, elastictrain_torch; print(elastictrain.__file__, "
              "elastictrain_torch.__file__)"], repo, 60)
    assert r.stdout.count(str(repo)) == 2, r.stdout


def test_the_readme_demo_runs(repo):
    venv = VENV_BIN.parent
    stamp = subprocess.run(["cksum", "pyproject.toml"], cwd=repo, capture_output=True, text=True,
                           check=True).stdout.split()[0]
    # -o: the venv is installed already (this test runs in it); make would otherwise reinstall it
    r = _run(["make", "demo", f"VENV={venv}", "-o", f"{venv}/.core-{stamp}"], repo, 300)
    assert "every sample trained on exactly once per epoch: True" in r.stdout + r.stderr


def test_the_readme_quick_start_runs_as_written(repo):
    text = (repo / "README.md").read_text()
    section = text[text.index("## Quick start for your training script"):]
    (repo / "train.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    launch = re.search(r"```bash\n(etrun [^\n]*?train\.py)", section).group(1)  # the first launch line
    r = _run(["bash", "-c", launch], repo, 300)
    nproc = int(re.search(r"--nproc-per-node (\d+)", launch).group(1))
    assert len(re.findall(r"rank \d: done at step \d+", r.stdout)) == nproc, r.stdout[-2000:]


@pytest.mark.parametrize("name, block", _runnable_blocks(), ids=[n for n, _ in _runnable_blocks()])
def test_runnable_docs_blocks_exit_0(repo, name, block):
    _run(["bash", "-euo", "pipefail", "-c", block], repo, 300)


def test_the_docs_have_runnable_blocks():
    names = {n.split("#")[0] for n, _ in _runnable_blocks()}
    assert {"simulator.md", "checkpoint.md", "interleaving.md"} <= names, names
