"""mkernelStats_t as mkernel_api.h declares it: the struct is read from the header, never copied.

The reader accepts only what the header uses (fixed-width integer fields and arrays of them) and
refuses anything else, so a change to the struct that it cannot follow is an error, not a silent
misreading.
"""
import ctypes
import re

_CTYPES = {
    "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64, "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
}
_STRUCT = re.compile(r"typedef\s+struct\s*(?:\w+\s*)?\{(?P<body>[^{}]*)\}\s*(?P<name>\w+)\s*;", re.S)
_FIELD = re.compile(r"(?P<type>\w+)\s+(?P<name>[A-Za-z_]\w*)\s*(?:\[\s*(?P<count>\d+)\s*\])?")


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_struct(header_text, struct_name="mkernelStats_t"):
    """[(field name, C type, element count or None)] of the typedef'd struct, in order."""
    for m in _STRUCT.finditer(_strip_comments(header_text)):
        if m.group("name") != struct_name:
            continue
        fields = []
        decls = [d.strip() for d in m.group("body").split(";")]
        if decls and decls[-1] == "":
            decls.pop()
        for decl in decls:
            f = _FIELD.fullmatch(decl)
            if f is None or f.group("type") not in _CTYPES:
                raise ValueError(f"{struct_name}: cannot read the declaration '{decl}'")
            count = f.group("count")
            fields.append((f.group("name"), f.group("type"), int(count) if count else None))
        if not fields or fields[0][:2] != ("size", "uint64_t"):
            raise ValueError(f"{struct_name}: the first field is not 'uint64_t size'")
        return fields
    raise ValueError(f"no 'typedef struct {{...}} {struct_name};' in the header")


def stats_struct(header_text):
    """A ctypes.Structure with mkernelStats_t's layout (natural alignment, as the C compiler)."""
    fields = []
    for name, ctype, count in parse_struct(header_text):
        t = _CTYPES[ctype]
        fields.append((name, t * count if count else t))
    return type("mkernelStats_t", (ctypes.Structure,), {"_fields_": fields})
