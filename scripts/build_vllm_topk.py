#!/usr/bin/env python3
"""Build vLLM 0.33.0's decode top-k kernels behind dsa_lab's C entry point, for a GPU whose torch is not vLLM's.

    python3 scripts/build_vllm_topk.py                 # into build/vllm_topk/ (git-ignored)
    python3 scripts/build_vllm_topk.py --sdist vllm-0.33.0.tar.gz --out DIR

Takes vLLM's source distribution from PyPI (or `--sdist`), checks its sha256 against the one PyPI
publishes, reads the kernel headers out of it (`csrc/*topk*.cuh`: CUDA and CUB only) into a
temporary folder, and compiles `dsa_lab/topk/csrc/vllm_topk_entry.cu` against them with nvcc for
sm_90a into `libdsa_vllm_topk.so` (about 9 MB; 3 minutes on two cores), stripped of symbols it does
not export. `build.json` beside it records the sdist (name, url, sha256), the headers' and entry
point's sha256, nvcc's version and flags and the time: what a run's provenance names. Nothing of
vLLM's source is written outside the temporary folder. Carry the output folder to the device and
point `DSA_LAB_VLLM_TOPK` at it (or leave it at build/vllm_topk/ in the checkout that travels).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

VERSION = "0.33.0"
INDEX = "https://pypi.org/simple/vllm/"
HEADERS = (
    "cooperative_topk.cuh",
    "cooperative_topk_overflow.cuh",
    "persistent_topk.cuh",
    "persistent_topk_overflow.cuh",
    "sampled_topk.cuh",
    "topk_histogram_4096.cuh",
    "topk_histogram_4096_overflow.cuh",
)
REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "dsa_lab" / "topk" / "csrc"
FLAGS = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC"]
FLAGS += ["-diag-suppress", "802"]  # a nonstandard default argument in vLLM's headers


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def published_sdist() -> tuple[str, str]:
    """(url, sha256) of vllm-VERSION.tar.gz as PyPI's simple index lists it."""
    with urllib.request.urlopen(INDEX, timeout=60) as response:
        page = response.read().decode()
    found = re.search(rf'href="([^"#]+/vllm-{re.escape(VERSION)}\.tar\.gz)#sha256=([0-9a-f]{{64}})"', page)
    if found is None:
        sys.exit(f"build_vllm_topk: {INDEX} lists no vllm-{VERSION}.tar.gz")
    return found.group(1), found.group(2)


def fetch_sdist(folder: Path) -> tuple[Path, str, str]:
    url, expected = published_sdist()
    target = folder / f"vllm-{VERSION}.tar.gz"
    print(f"build_vllm_topk: downloading {url}", file=sys.stderr)
    with urllib.request.urlopen(url, timeout=600) as response, target.open("wb") as out:
        shutil.copyfileobj(response, out)
    return target, url, expected


def extract_headers(sdist: Path, folder: Path) -> dict[str, str]:
    """The kernel headers into `folder`; {name: sha256}."""
    wanted = {f"vllm-{VERSION}/csrc/{name}": name for name in HEADERS}
    with tarfile.open(sdist) as archive:
        members = {m.name: m for m in archive.getmembers() if m.name in wanted}
        missing = sorted(set(wanted) - set(members))
        if missing:
            sys.exit(f"build_vllm_topk: {sdist} lacks {missing}")
        for name, member in members.items():
            data = archive.extractfile(member)
            assert data is not None
            (folder / wanted[name]).write_bytes(data.read())
    return {name: sha256(folder / name) for name in HEADERS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help=f"a local vllm-{VERSION}.tar.gz (its sha256 is still checked)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "vllm_topk", help="the output folder")
    args = parser.parse_args()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("build_vllm_topk: nvcc is not on PATH (CUDA 12.8 or newer builds sm_90a)")
    with tempfile.TemporaryDirectory(prefix="vllm-topk-") as tmp:
        work = Path(tmp)
        if args.sdist is not None:
            url, expected = published_sdist()
            sdist = args.sdist
        else:
            sdist, url, expected = fetch_sdist(work)
        got = sha256(sdist)
        if got != expected:
            sys.exit(f"build_vllm_topk: {sdist} has sha256 {got}, PyPI publishes {expected}: not vLLM {VERSION}'s")
        headers = extract_headers(sdist, work)
        args.out.mkdir(parents=True, exist_ok=True)
        library = args.out / "libdsa_vllm_topk.so"
        entry = SOURCES / "vllm_topk_entry.cu"
        command = [nvcc, *FLAGS, f"-I{SOURCES}", f"-I{work}", "-o", str(library), str(entry)]
        print("build_vllm_topk: " + " ".join(command[1:]), file=sys.stderr)
        started = time.time()
        subprocess.run(command, check=True)
        subprocess.run(["strip", "--strip-unneeded", str(library)], check=True)
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    record = {
        "vllm_sdist": f"vllm-{VERSION}.tar.gz",
        "vllm_sdist_url": url,
        "vllm_sdist_sha256": got,
        "vllm_headers_sha256": headers,
        "entry_sha256": sha256(entry),
        "rules_sha256": sha256(SOURCES / "vllm_topk_rules.h"),
        "nvcc": version.strip().splitlines()[-1],
        "flags": FLAGS,
        "built": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "build_seconds": round(time.time() - started, 1),
    }
    (args.out / "build.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"build_vllm_topk: {library} ({library.stat().st_size / 1e6:.1f} MB) and build.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
