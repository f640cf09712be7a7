"""A non-editable install must find the Hydra configs and the bundled corpus."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_configs_and_corpus_and_finds_them(tmp_path):
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("cdlm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    conf_files = sorted(str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml"))
    assert (
        sorted(
            n[len("cdlm/conf/") :]
            for n in names
            if n.startswith("cdlm/conf/") and n.endswith(".yaml")
        )
        == conf_files
    )
    assert sum(n.startswith("cdlm/data/austen/") and n.endswith(".txt.gz") for n in names) == 6
    assert "cdlm/data/austen/PROVENANCE.md" in names
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cdlm").rglob("*.py"))
    assert sorted(n for n in names if n.startswith("cdlm/") and n.endswith(".py")) == modules

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import cdlm, hydra; from hydra import compose, initialize_config_dir\n"
        "from cdlm.data.corpus import BUNDLED\n"
        "d = cdlm.config_dir(); print(d); print(BUNDLED)\n"
        "with initialize_config_dir(str(d), version_base='1.3'):\n"
        "    cfg = compose('train', overrides=['experiment=quickstart'])\n"
        "print(cfg.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(site)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    conf, bundled, name = out.stdout.split()
    assert Path(conf) == site / "cdlm" / "conf"
    assert Path(bundled) == site / "cdlm" / "data" / "austen"
    assert name == "quickstart"
