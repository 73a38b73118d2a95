"""mkernel: an NCCL-compatible collective communication plugin, from Python.

One shared library, libmkernel.so, is three things: an LD_PRELOAD shim over NCCL, an NCCL net
plugin and an NCCL tuner plugin. This package ships it and says where it is:

  LD_PRELOAD=$(python -m mkernel --lib) torchrun ...      # or: python -m mkernel.run torchrun ...
  NCCL_NET_PLUGIN=mkernel LD_LIBRARY_PATH=$(python -m mkernel --plugin-dir) ...

library_path()  the library (MKERNEL_LIB if set, else the packaged copy, else a source tree's
                build/lib/libmkernel.so)
plugin_dir()    a folder holding libnccl-net-mkernel.so and libnccl-tuner-mkernel.so, links to
                that library (a wheel holds no links: they are made at first use in the user's
                cache folder, $XDG_CACHE_HOME/mkernel or ~/.cache/mkernel)
version()       mkernelVersionString() of the library: "mkernel X.Y.Z"
stats()         mkernelGetStats() of this process as a dict, read through the struct layout of
                the mkernel_api.h that comes with the library
"""
import ctypes
import hashlib
import os

from ._header import stats_struct

__all__ = ["library_path", "header_path", "plugin_dir", "version", "stats", "loaded_library"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# Inside a source tree: python/mkernel/ -> the repository root.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(_HERE))
PLUGIN_NAMES = ("libnccl-net-mkernel.so", "libnccl-tuner-mkernel.so")


def library_path():
    """Absolute path of libmkernel.so; FileNotFoundError when there is none."""
    candidates = []
    if os.environ.get("MKERNEL_LIB"):
        candidates.append(os.environ["MKERNEL_LIB"])
    else:
        candidates.append(os.path.join(_HERE, "lib", "libmkernel.so"))
        candidates.append(os.path.join(_SOURCE_ROOT, "build", "lib", "libmkernel.so"))
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise FileNotFoundError("libmkernel.so not found (looked at: " + ", ".join(candidates) +
                            "); install the package (pip install .) or set MKERNEL_LIB")


def header_path():
    """mkernel_api.h that matches library_path(): the packaged copy, else the source tree's."""
    for path in (os.path.join(_HERE, "include", "mkernel_api.h"),
                 os.path.join(_SOURCE_ROOT, "plugin", "mkernel_api.h")):
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("mkernel_api.h not found next to the package nor in a source tree")


def _links_ok(folder, target):
    return all(os.path.realpath(os.path.join(folder, n)) == os.path.realpath(target) for n in PLUGIN_NAMES)


def plugin_dir():
    """A folder where NCCL finds mkernel's plugins by name (NCCL_NET_PLUGIN=mkernel,
    NCCL_TUNER_PLUGIN=mkernel with the folder on LD_LIBRARY_PATH). The plugin names are symlinks
    to library_path(), never copies: a process that LD_PRELOADs the library and loads the
    plugins then maps one copy of it."""
    lib = library_path()
    here = os.path.dirname(lib)
    if _links_ok(here, lib):  # an install tree or a build tree: the links are already there
        return here
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(os.path.realpath(lib).encode()).hexdigest()[:16]
    folder = os.path.join(cache, "mkernel", "plugins-" + key)
    os.makedirs(folder, exist_ok=True)
    for name in PLUGIN_NAMES:
        link = os.path.join(folder, name)
        if os.path.realpath(link) == os.path.realpath(lib):
            continue
        tmp = f"{link}.{os.getpid()}.tmp"
        os.symlink(lib, tmp)
        os.replace(tmp, link)  # atomic: concurrent first uses (one per rank) agree
    return folder


def loaded_library():
    """The process's copy of the library when it is already loaded (LD_PRELOAD, or an earlier
    call here), as a ctypes handle whose mkernelGetStats is that copy's; else None."""
    try:
        ctypes.CDLL(None).mkernelGetStats  # dlsym(RTLD_DEFAULT): LD_PRELOADed libraries
        return ctypes.CDLL(None)
    except AttributeError:
        pass
    try:  # loaded with RTLD_LOCAL (ctypes, NCCL's plugin loader): RTLD_NOLOAD finds it by path
        return ctypes.CDLL(library_path(), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    except (OSError, FileNotFoundError):
        return None


def _library(load):
    so = loaded_library()
    if so is None and load:
        so = ctypes.CDLL(library_path())
    return so


def version():
    """mkernelVersionString() of the library: "mkernel X.Y.Z" (loads the library if needed)."""
    fn = _library(True).mkernelVersionString
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode()


_STATS_TYPE = None


def stats_type():
    """The ctypes.Structure of mkernelStats_t, read from header_path()."""
    global _STATS_TYPE
    if _STATS_TYPE is None:
        with open(header_path()) as f:
            _STATS_TYPE = stats_struct(f.read())
    return _STATS_TYPE


def stats(load=True):
    """mkernelGetStats() of this process: {field: int or [int per ncclFunc_t]} in the header's
    order (without `size`). load=False: None when the library is not loaded in this process
    (e.g. not LD_PRELOADed) instead of loading it."""
    so = _library(load)
    if so is None:
        return None
    t = stats_type()
    s = t()
    s.size = ctypes.sizeof(t)
    fn = so.mkernelGetStats
    fn.argtypes = [ctypes.POINTER(t)]
    fn.restype = ctypes.c_int
    if fn(ctypes.byref(s)) != 0:
        raise RuntimeError("mkernelGetStats failed")
    out = {}
    for name, _ in t._fields_[1:]:
        v = getattr(s, name)
        out[name] = list(v) if isinstance(v, ctypes.Array) else int(v)
    return out
