"""Generate a CPython extension module (METH_FASTCALL wrappers) around plain C/C++ functions."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from tuneforge.compile.pch import PROLOGUE
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import CompileError

_PROTOTYPE = re.compile(r"^\s*(?P<ret>[A-Za-z_][\w\s\*]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*\((?P<args>[^()]*)\)\s*;?\s*$")
_TYPE_WORDS = frozenset({"const", "unsigned", "signed", "int", "long", "short", "char", "float", "double",
                         "bool", "void", "size_t", "ptrdiff_t", "ssize_t"})
_INTS = frozenset({"int", "unsigned", "unsigned int", "long", "unsigned long", "long long",
                   "unsigned long long", "short", "unsigned short", "char", "signed char", "unsigned char",
                   "bool", "size_t", "ptrdiff_t", "ssize_t", "int8_t", "int16_t", "int32_t", "int64_t",
                   "uint8_t", "uint16_t", "uint32_t", "uint64_t", "intptr_t", "uintptr_t", "long int"})
_FLOATS = frozenset({"float", "double"})


@dataclass(frozen=True)
class Param:
    ctype: str  # as written, e.g. "const float*"
    kind: str  # pointer, int or float

    @property
    def writable(self) -> bool:
        return self.kind == "pointer" and not self.ctype.replace(" ", "").startswith("const")


@dataclass(frozen=True)
class Prototype:
    name: str
    ret: str
    ret_kind: str  # void, int or float
    params: tuple[Param, ...]


def _classify(ctype: str, prototype: str) -> str:
    if "*" in ctype:
        return "pointer"
    base = " ".join(w for w in ctype.split() if w != "const")
    if base in _FLOATS:
        return "float"
    if base in _INTS:
        return "int"
    if base == "void":
        return "void"
    raise CompileError(f"unsupported type {ctype!r} in prototype {prototype!r}: use pointers, integer or "
                       "floating-point types", command=[], stderr="", source_path=None)


def _param_type(arg: str) -> str:
    match = re.match(r"^(?P<type>.*?[\s\*&])(?P<name>[A-Za-z_]\w*)$", arg)
    if match and match.group("name") not in _TYPE_WORDS and match.group("type").strip():
        return match.group("type").strip()
    return arg.strip()


def parse_prototype(text: str) -> Prototype:
    match = _PROTOTYPE.match(text)
    if not match:
        raise CompileError(f"cannot parse C prototype {text!r}; expected e.g. 'void add(float* out, int64_t n)'",
                           command=[], stderr="", source_path=None)
    args = [a.strip() for a in match.group("args").split(",")]
    if args in ([""], ["void"]):
        args = []
    params = []
    for arg in args:
        ctype = _param_type(arg)
        kind = _classify(ctype, text)
        if kind == "void":
            raise CompileError(f"a parameter cannot be void in {text!r}", command=[], stderr="", source_path=None)
        params.append(Param(ctype, kind))
    ret = match.group("ret").strip()
    ret_kind = _classify(ret, text)
    if ret_kind == "pointer":
        raise CompileError(f"returning a pointer is not supported in {text!r}", command=[], stderr="",
                           source_path=None)
    return Prototype(match.group("name"), ret, ret_kind, tuple(params))


_PRELUDE = r"""
namespace tuneforge_bind {
struct Buf {
  Py_buffer view;
  bool held = false;
  ~Buf() { if (held) PyBuffer_Release(&view); }
};
// A pointer argument: an integer address, None (nullptr), or any object with the buffer protocol.
static int pointer(PyObject* obj, bool writable, Buf& buf, void** out) {
  if (obj == Py_None) { *out = nullptr; return 0; }
  if (PyLong_Check(obj)) { *out = PyLong_AsVoidPtr(obj); return PyErr_Occurred() ? -1 : 0; }
  if (PyObject_GetBuffer(obj, &buf.view, PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0)) != 0) return -1;
  buf.held = true;
  *out = buf.view.buf;
  return 0;
}
}  // namespace tuneforge_bind
"""


def _wrapper(proto: Prototype, *, opaque: bool) -> str:
    lines = [f"static PyObject* tuneforge_wrap_{proto.name}(PyObject*, PyObject* const* args, Py_ssize_t nargs) {{",
             f"  if (nargs != {len(proto.params)}) {{",
             f'    PyErr_Format(PyExc_TypeError, "{proto.name}() takes {len(proto.params)} arguments (%zd given)",'
             " nargs);",
             "    return NULL;", "  }"]
    call_args = []
    for i, param in enumerate(proto.params):
        if param.kind == "pointer":
            lines += [f"  tuneforge_bind::Buf b{i}; void* a{i};",
                      f"  if (tuneforge_bind::pointer(args[{i}], {str(param.writable).lower()}, b{i}, &a{i})) "
                      "return NULL;"]
        elif param.kind == "int":
            lines += [f"  long long a{i} = PyLong_AsLongLong(args[{i}]);",
                      f"  if (a{i} == -1 && PyErr_Occurred()) return NULL;"]
        else:
            lines += [f"  double a{i} = PyFloat_AsDouble(args[{i}]);",
                      f"  if (a{i} == -1.0 && PyErr_Occurred()) return NULL;"]
        call_args.append(f"a{i}" if opaque and param.kind == "pointer" else f"({param.ctype})a{i}")
    call = f"{proto.name}({', '.join(call_args)})"
    if proto.ret_kind == "void":
        lines += ["  Py_BEGIN_ALLOW_THREADS", f"  {call};", "  Py_END_ALLOW_THREADS", "  Py_RETURN_NONE;"]
    else:
        convert = "PyLong_FromLongLong((long long)r)" if proto.ret_kind == "int" else "PyFloat_FromDouble((double)r)"
        lines += [f"  {proto.ret} r;", "  Py_BEGIN_ALLOW_THREADS", f"  r = {call};", "  Py_END_ALLOW_THREADS",
                  f"  return {convert};"]
    lines.append("}")
    return "\n".join(lines)


def _checked(functions: Sequence[str]) -> list[Prototype]:
    protos = [parse_prototype(f) for f in functions]
    names = [p.name for p in protos]
    if len(set(names)) != len(names):
        raise CompileError(f"duplicate function names in {names}", command=[], stderr="", source_path=None)
    return protos


def module_name(source: str, functions: Sequence[str]) -> str:
    return "tfmod_" + hashlib.sha256((source + "\0" + "\0".join(functions)).encode()).hexdigest()[:20]


def _bindings(protos: Sequence[Prototype], *, opaque: bool) -> list[str]:
    """The wrappers, method table, module definition and `tuneforge_make_module(name)`."""
    table = "\n".join(f'  {{"{p.name}", (PyCFunction)(void (*)(void))tuneforge_wrap_{p.name}, METH_FASTCALL, '
                      f'"{p.ret} {p.name}({", ".join(q.ctype for q in p.params)})"}},' for p in protos)
    return [_PRELUDE, *(_wrapper(p, opaque=opaque) for p in protos),
            f"static PyMethodDef tuneforge_methods[] = {{\n{table}\n  {{NULL, NULL, 0, NULL}}\n}};",
            "static struct PyModuleDef tuneforge_module = {PyModuleDef_HEAD_INIT, NULL, NULL, -1, tuneforge_methods};",
            _make_module([p.name for p in protos])]


def module_source(source: str, functions: Sequence[str]) -> str:
    """A complete extension module in one translation unit: the user's source, then wrappers and PyInit."""
    protos = _checked(functions)
    module = module_name(source, functions)
    return "\n".join([
        *PROLOGUE.rstrip("\n").split("\n"),  # what pch.py precompiles: keep it first
        "// ---- user source ----", source, "// ---- generated bindings ----", *_bindings(protos, opaque=False),
        f'PyMODINIT_FUNC PyInit_{module}(void) {{ return tuneforge_make_module("{module}"); }}', "",
    ])


# The same module as two translation units (split_module.py): the user's source without Python.h, and
# bindings that depend only on the functions' prototypes, compiled once and linked into every module.
_LOCAL = '__attribute__((visibility("hidden")))'  # resolved inside each module, never across modules


def kernel_unit(source: str, functions: Sequence[str]) -> str:
    """The user's source; each function declared again with C linkage (a mismatch is a compile error, not a
    wrong call) and aliased (an alias of a function the unit does not define is a compile error, as the
    one-unit module's call of it is, not an import error); and a PyInit that hands over to the bindings unit."""
    protos = _checked(functions)
    module = module_name(source, functions)
    declared = [f.strip().rstrip(";") for f in functions]
    aliases = [re.sub(rf"\b{p.name}\s*\(", f"tuneforge_defined_{p.name}(", text, count=1)
               + f' {_LOCAL} __attribute__((alias("{p.name}")))' for p, text in zip(protos, declared, strict=True)]
    return "\n".join([
        "#include <stdint.h>", "#include <stddef.h>", "// ---- user source ----", source,
        "// ---- generated entry points ----", *(f'extern "C" {text};' for text in [*declared, *aliases]),
        f'extern "C" {_LOCAL} struct _object* tuneforge_make_module(const char* name);',
        f'extern "C" __attribute__((visibility("default"))) struct _object* PyInit_{module}(void) {{',
        f'  return tuneforge_make_module("{module}");', "}", "",
    ])


def bindings_unit(functions: Sequence[str]) -> str:
    """The wrappers for `functions`, apart from their source. Pointers are declared `void*`: the unit never
    sees the user's types (a pointer to a user typedef is passed as is), and a pointer is a pointer in
    the calling convention."""
    protos = _checked(functions)
    declarations = [f'extern "C" {p.ret} {p.name}({", ".join(_opaque(q) for q in p.params)});' for p in protos]
    return "\n".join([*PROLOGUE.rstrip("\n").split("\n"), *declarations, *_bindings(protos, opaque=True), ""])


def _opaque(param: Param) -> str:
    return "void*" if param.kind == "pointer" else param.ctype


def _make_module(names: Sequence[str]) -> str:
    """The module, plus `tuneforge_addresses` mapping each function's name to its C address, so a C caller
    (a dispatcher) can skip the Python wrapper."""
    adds = "\n".join(f'  if (tuneforge_add_address(addresses, "{n}", (void*)&{n})) {{ Py_DECREF(m); return NULL; }}'
                     for n in names)
    return "\n".join([
        "static int tuneforge_add_address(PyObject* d, const char* name, void* fn) {",
        "  PyObject* v = PyLong_FromVoidPtr(fn);",
        "  int rc = v ? PyDict_SetItemString(d, name, v) : -1;",
        "  Py_XDECREF(v);",
        "  return rc;",
        "}",
        f'extern "C" {_LOCAL} PyObject* tuneforge_make_module(const char* name) {{',
        "  tuneforge_module.m_name = name;",
        "  PyObject* m = PyModule_Create(&tuneforge_module);",
        "  if (m == NULL) return NULL;",
        "  PyObject* addresses = PyDict_New();",
        "  if (addresses == NULL || PyModule_AddObject(m, \"tuneforge_addresses\", addresses) < 0) {",
        "    Py_XDECREF(addresses); Py_DECREF(m); return NULL;",
        "  }",
        adds,
        "  return m;",
        "}",
    ])
