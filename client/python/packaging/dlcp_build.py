"""The PEP 517 build backend of the dlcp Python package (pyproject.toml names it).

It drives the project's own CMake build, for the interpreter that runs it, and packs what that
build assembles in <build>/python/dlcp (the pure-Python modules, the type stubs and the _dlcp
extension), plus libdlcp.so and its C header, into a wheel. It needs nothing but the standard
library, CMake and a compiler with the project's dependencies (gRPC, protobuf, Abseil, pybind11):
so `pip install --no-build-isolation .` works where no package index can be reached, and
pip's isolated build works too (there is nothing to fetch).

Config settings (pip --config-settings NAME=VALUE):
  build-dir   the CMake build folder (default: build-pip-<python tag> in the source tree). An
              already configured one (make build's `build`) is used as it is configured, after
              checking that its extension is for this interpreter; only the package's targets
              are built.
  cmake-args  more -D settings for a new build folder, separated by spaces (also $CMAKE_ARGS),
              e.g. "-DDLCP_WITH_CUDA=OFF".
  jobs        parallel compile jobs (default: the CPUs).
"""
import base64
import hashlib
import io
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

SOURCE = pathlib.Path(__file__).resolve().parents[3]
TARGETS = ("dlcp_python", "dlcp_shared")


def _version():
    match = re.search(r"^project\(dlcp VERSION ([0-9.]+)", (SOURCE / "CMakeLists.txt").read_text(), re.M)
    if not match:
        raise RuntimeError("dlcp: cannot read the release from CMakeLists.txt")
    return match.group(1)


def _tag():
    """The wheel's tag for this interpreter: cp311-cp311-linux_x86_64."""
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{impl}-{impl}-{platform}"


def _setting(config_settings, name, default=None):
    value = (config_settings or {}).get(name, default)
    return value[-1] if isinstance(value, list) else value


def _run(cmd):
    print("dlcp build:", " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=SOURCE)


def _configure(build, config_settings):
    """A new build folder for this interpreter; an existing one as it is."""
    if (build / "CMakeCache.txt").exists():
        return
    args = shlex.split(os.environ.get("CMAKE_ARGS", "")) + shlex.split(_setting(config_settings, "cmake-args", ""))
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"] if shutil.which(
        "ccache") else []
    _run(["cmake", "-S", SOURCE, "-B", build, *generator, "-DCMAKE_BUILD_TYPE=Release",
          f"-DPython3_EXECUTABLE={sys.executable}", "-DDLCP_BUILD_TESTS=OFF", "-DDLCP_BUILD_BENCH=OFF", *launcher,
          *args])


def _built_package(build):
    """<build>/python/dlcp, with an extension for this interpreter, or RuntimeError saying why not."""
    package = build / "python" / "dlcp"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not (package / f"_dlcp{suffix}").exists():
        found = sorted(p.name for p in package.glob("_dlcp*.so")) if package.exists() else []
        raise RuntimeError(f"dlcp: {build} built no _dlcp{suffix} for {sys.executable} (found {found or 'none'}); "
                           f"a build folder serves the Python it was configured with: choose another build-dir")
    return package


def _build(config_settings):
    default = SOURCE / f"build-pip-{_tag().split('-')[0]}"
    build = pathlib.Path(_setting(config_settings, "build-dir") or default).resolve()
    _configure(build, config_settings)
    jobs = _setting(config_settings, "jobs") or str(os.cpu_count() or 1)
    _run(["cmake", "--build", build, "--parallel", jobs, "--target", *TARGETS])
    return build


def _files(build):
    """(path in the wheel, file) for everything the wheel holds."""
    package = _built_package(build)
    out = []
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            out.append((f"dlcp/{path.relative_to(package).as_posix()}", path))
    library = build / "client" / "libdlcp.so.0"
    if library.exists():
        out.append(("dlcp/lib/libdlcp.so.0", library.resolve()))
        out.append(("dlcp/include/dlcp.h", SOURCE / "client" / "capi" / "dlcp.h"))
    return out


def _metadata(version):
    readme = (SOURCE / "README.md").read_text().split("\n## ", 1)[0]
    return (f"Metadata-Version: 2.1\nName: dlcp\nVersion: {version}\n"
            "Summary: Gradient aggregation for data-parallel training: priority classes, bounded loss, DeAR "
            "pipelining\nRequires-Python: >=3.9\nRequires-Dist: numpy\nProvides-Extra: torch\n"
            "Requires-Dist: torch>=1.13; extra == \"torch\"\nDescription-Content-Type: text/markdown\n\n" + readme)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build = _build(config_settings)
    version, tag = _version(), _tag()
    name = f"dlcp-{version}-{tag}.whl"
    info = f"dlcp-{version}.dist-info"
    meta = {
        f"{info}/METADATA": _metadata(version).encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: dlcp_build\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
        f"{info}/top_level.txt": b"dlcp\n",
    }
    records = []
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for arcname, path in _files(build):
            data = path.read_bytes()
            info_ = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info_.external_attr = (0o755 if os.access(path, os.X_OK) else 0o644) << 16
            wheel.writestr(info_, data, zipfile.ZIP_DEFLATED)
            records.append(_record_line(arcname, data))
        for arcname, data in meta.items():
            wheel.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        records.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []  # CMake, the compiler and the C++ dependencies come from the system


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    """The files git tracks (the whole source tree: the package is built by the project's CMake)."""
    version = _version()
    base = f"dlcp-{version}"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=SOURCE, check=True, capture_output=True).stdout
    name = f"{base}.tar.gz"
    with tarfile.open(pathlib.Path(sdist_directory) / name, "w:gz") as tar:
        for rel in sorted(filter(None, listed.decode().split("\0"))):
            if (SOURCE / rel).is_file():
                tar.add(SOURCE / rel, arcname=f"{base}/{rel}", recursive=False)
        pkg_info = _metadata(version).encode()
        entry = tarfile.TarInfo(f"{base}/PKG-INFO")
        entry.size = len(pkg_info)
        tar.addfile(entry, io.BytesIO(pkg_info))
    return name
