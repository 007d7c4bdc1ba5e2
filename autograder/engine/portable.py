"""Ship functions and classes defined in a notebook cell to a spawned worker process.

Under ``spawn`` (Windows; Python 3.14 makes ``forkserver`` Linux's default) a DataLoader worker is
a new interpreter that can only import objects from modules, so a function or class defined in a
notebook cell cannot be loaded there. ``portable`` ships such an object by value (its compiled
code and the module-level names it uses) and the worker rebuilds it; a dataset *instance* still
travels by pickling, exactly as spawn does it, so a generator built in ``__init__`` arrives as a copy.
"""

from __future__ import annotations

import builtins
import functools
import marshal
import os
import pickle
import sys
import sysconfig
import types

from torch.utils.data import Dataset


def _is_notebook_defined(obj) -> bool:
    return getattr(obj, "__module__", None) == "__main__"


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return names


class _Packer:
    """Encodes notebook-defined functions and classes, plus the globals they use, as plain data."""

    def __init__(self, namespace: dict):
        self.source_namespace = namespace
        self.globals: dict[str, tuple] = {}

    def value(self, value):
        if isinstance(value, types.ModuleType):
            return ("module", value.__name__)
        if isinstance(value, types.FunctionType) and _is_notebook_defined(value):
            return ("function", self.function(value))
        if isinstance(value, type) and _is_notebook_defined(value):
            return ("class", self.klass(value))
        return ("pickle", pickle.dumps(value))

    def _globals_of(self, code: types.CodeType) -> None:
        for name in sorted(_referenced_names(code)):
            if name in self.globals or name not in self.source_namespace:
                continue
            self.globals[name] = ("pending",)  # stops cycles: a class whose methods name the class
            try:
                self.globals[name] = self.value(self.source_namespace[name])
            except Exception:
                del self.globals[name]  # unpicklable and unused in the worker, most likely

    def function(self, fn: types.FunctionType) -> tuple:
        self._globals_of(fn.__code__)
        cells = []
        for free_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if free_name == "__class__":
                cells.append(("own_class",))  # zero-argument super(): filled in once the class exists
            else:
                cells.append(self.value(cell.cell_contents))
        return (marshal.dumps(fn.__code__), fn.__name__, fn.__qualname__,
                tuple(self.value(d) for d in (fn.__defaults__ or ())),
                {k: self.value(v) for k, v in (fn.__kwdefaults__ or {}).items()}, cells)

    def klass(self, cls: type) -> tuple:
        members = {}
        for name, member in vars(cls).items():
            if isinstance(member, (staticmethod, classmethod)):
                members[name] = (type(member).__name__, self.function(member.__func__))
            elif isinstance(member, property):
                members[name] = ("property", *(self.function(f) if f else None
                                               for f in (member.fget, member.fset, member.fdel)))
            elif isinstance(member, types.FunctionType):
                members[name] = ("method", self.function(member))
            elif name == "__doc__" or not (name.startswith("__") and name.endswith("__")):
                members[name] = ("attribute", self.value(member))
        bases = tuple(self.value(b) for b in cls.__bases__)
        return (cls.__name__, cls.__qualname__, bases, members)


class _DataPacker(_Packer):
    """Packs like _Packer, but runs none of the code it packs: values travel as data only.

    _Packer pickles every value it meets, and pickling an object runs its class's ``__reduce__``, its
    ``__getstate__``, a ``copyreg`` entry: learner code, running in the process that packs. A fresh
    process that a check resumes in (``autograder.engine.fresh_process``) is packed in a process that may hold
    what the check must keep to itself, so here only these travel: plain data (numbers, strings, bytes,
    ranges, the builtin containers of them), NumPy arrays and tensors that own their memory, functions and
    classes by value where ``by_value(obj)`` says so (their code, and the globals, defaults and closure
    cells they use, packed the same way), modules, functions and classes of importable modules by name.
    Anything else (an mmap, a socket, a tensor in shared memory, an object of any other class) stays
    behind: ``left_out`` says which global or cell, and what it was.
    """

    def __init__(self, by_value):
        super().__init__({})
        self.by_value = by_value
        self.left_out: dict[str, str] = {}
        self.own_modules: dict[str, list] = {}     # "paths" for sys.path, "files" to read (see _own_module)
        self._where = "an argument"

    def function(self, fn: types.FunctionType) -> tuple:
        outer = self.source_namespace, self._where
        self.source_namespace = fn.__globals__
        try:
            self._globals_of(fn.__code__)
            cells = []
            for free_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                self._where = f"{fn.__name__}'s closure variable {free_name}"
                if free_name == "__class__":
                    cells.append(("own_class",))
                else:
                    try:
                        cells.append(self.value(cell.cell_contents))
                    except ValueError:           # an empty cell stays empty
                        cells.append(("left out", "an empty cell"))
            self._where = f"a default of {fn.__name__}"
            defaults = tuple(self.value(d) for d in (fn.__defaults__ or ()))
            kwdefaults = {k: self.value(v) for k, v in (fn.__kwdefaults__ or {}).items()}
            return marshal.dumps(fn.__code__), fn.__name__, fn.__qualname__, defaults, kwdefaults, cells
        finally:
            self.source_namespace, self._where = outer

    def _globals_of(self, code: types.CodeType) -> None:
        for name in sorted(_global_names(code)):
            if name in self.globals or name not in self.source_namespace:
                continue
            self.globals[name] = ("pending",)  # stops cycles: a class whose methods name the class
            outer, self._where = self._where, name
            try:
                self.globals[name] = self.value(self.source_namespace[name])
            finally:
                self._where = outer

    def value(self, value):
        kind = type(value)
        if kind in _PLAIN:
            return ("pickle", pickle.dumps(value))
        if kind in (list, tuple, set, frozenset):
            return ("container", kind.__name__, [self.value(v) for v in value])
        if kind is dict:
            return ("dict", [(self.value(k), self.value(v)) for k, v in value.items()])
        if isinstance(value, types.ModuleType):
            if not trusted_module(value):
                self._own_module(value)
            return ("module", value.__name__)
        if isinstance(value, (types.FunctionType, type)) and self.by_value(value):
            return ("function", self.function(value)) if isinstance(value, types.FunctionType) \
                else ("class", self.klass(value))
        why = _why_not_data(value)
        if why is None:
            return ("pickle", pickle.dumps(value))
        self.left_out.setdefault(self._where, why)
        return ("left out", why)

    def _own_module(self, module: types.ModuleType) -> None:
        """A module of the learner's own (or a test's): the fresh process imports it afresh, from its file,
        as a restarted job would. Its source files (the package's too) become readable there, and the folders
        they lie in listable, not readable: nothing else of the folder."""
        parts = module.__name__.split(".")
        files = []
        for depth in range(1, len(parts) + 1):
            found = sys.modules.get(".".join(parts[:depth]))
            if getattr(found, "__file__", None):
                files.append(os.path.realpath(found.__file__))
        if not files:
            return
        top = files[0]
        root = os.path.dirname(os.path.dirname(top) if os.path.basename(top) == "__init__.py" else top)
        self.own_modules.setdefault("paths", [])
        if root not in self.own_modules["paths"]:
            self.own_modules["paths"].append(root)
        self.own_modules.setdefault("files", [])
        self.own_modules["files"] += [f for f in files if f not in self.own_modules["files"]]


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the code nested in it) reads or writes: not its attributes' names,
    which share co_names with them."""
    import dis
    names = {i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice, type(...))


def _why_not_data(value) -> str | None:
    """None where ``value`` pickles as data without running code of the learner's (and shares no memory
    with the process it comes from); otherwise what it is, in a few words."""
    import numpy as np
    import torch
    kind = type(value)
    if kind in (torch.Tensor, torch.nn.Parameter):
        if value.is_shared() or not value.untyped_storage().resizable():
            return "a tensor whose memory is shared with another process or a file (share_memory_, from_file, frombuffer)"
        return None if value.layout == torch.strided and value.grad_fn is None else "a tensor of another kind"
    if kind is np.ndarray:
        base = value
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if not isinstance(base, np.ndarray):
            return f"a NumPy array over a {type(base).__name__}'s memory (np.frombuffer, np.memmap)"
        return None if value.dtype.kind in "biufcSU" else "a NumPy array of objects"
    if isinstance(value, (np.generic, np.dtype, torch.dtype, torch.device, torch.Size)):
        return None
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)) and _importable(value):
        return None     # pickled by name: the fresh process imports it
    return f"a {kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else f"a {kind.__qualname__}"


def _importable(obj) -> bool:
    """``obj`` is what its module, a module of the Python installation or of this package, holds under
    its qualified name: a fresh process gets it by importing that module."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if module is None or not trusted_module(module):
        return False
    found = module
    for part in getattr(obj, "__qualname__", "").split("."):
        found = getattr(found, part, None)
    return found is obj


def trusted_module(module: types.ModuleType) -> bool:
    """A module of the Python installation (its standard library, its site-packages) or of this package:
    what a fresh process imports is the very same code."""
    where = getattr(module, "__file__", None)
    if where is None:
        return module.__name__ != "__main__" and module.__name__ in sys.builtin_module_names
    where = _real_path(where)
    return any(where.startswith(root + os.sep) for root in trusted_roots())


def trusted_roots() -> list[str]:
    return list(_roots_for(tuple(sys.path)))


# A check asks for every object it sends to a fresh process (a few hundred a check): the installation's
# folders and a module's real path do not change while this process runs, sys.path is the key.
@functools.lru_cache(maxsize=8)
def _roots_for(path: tuple) -> tuple:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots |= {p for p in path if p and os.path.basename(p) in ("site-packages", "dist-packages")}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))       # this package (autograder/)
    return tuple(sorted({os.path.realpath(r) for r in roots}))


@functools.lru_cache(maxsize=4096)
def _real_path(where: str) -> str:
    return os.path.realpath(where)


class _Unpacker:
    def __init__(self, packed_globals: dict):
        self.namespace = {"__builtins__": builtins, "__name__": "__main__"}
        self.packed = packed_globals
        for name in packed_globals:
            if packed_globals[name][0] != "left out":       # a name that stayed behind is undefined here
                self.namespace[name] = self.value(packed_globals[name])

    def value(self, encoded):
        kind = encoded[0]
        if kind == "module":
            import importlib
            return importlib.import_module(encoded[1])
        if kind == "function":
            return self.function(encoded[1])[0]
        if kind == "class":
            return self.klass(encoded[1])
        if kind == "container":
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[encoded[1]](
                self.value(v) for v in encoded[2])
        if kind == "dict":
            return {self.value(k): self.value(v) for k, v in encoded[1]}
        if kind == "left out":
            return _LeftOut(encoded[1])
        return pickle.loads(encoded[1])

    def function(self, packed) -> tuple[types.FunctionType, list]:
        code, name, qualname, defaults, kwdefaults, cells = packed
        closure = tuple(types.CellType() if c[0] in ("own_class", "left out") else types.CellType(self.value(c))
                        for c in cells)
        fn = types.FunctionType(marshal.loads(code), self.namespace, name,
                                tuple(self.value(d) for d in defaults), closure or None)
        fn.__kwdefaults__ = {k: self.value(v) for k, v in kwdefaults.items()} or None
        fn.__qualname__, fn.__module__ = qualname, "__main__"
        own_class_cells = [cell for cell, c in zip(closure, cells) if c[0] == "own_class"]
        return fn, own_class_cells

    def klass(self, packed) -> type:
        name, qualname, bases, members = packed
        if isinstance(self.namespace.get(name), type) and self.namespace[name].__qualname__ == qualname:
            return self.namespace[name]  # already rebuilt (a method referred to its own class)
        namespace, own_class_cells = {"__module__": "__main__", "__qualname__": qualname}, []
        for member_name, (kind, *rest) in members.items():
            if kind == "attribute":
                namespace[member_name] = self.value(rest[0])
                continue
            if kind == "property":
                parts = []
                for packed_fn in rest:
                    fn, cells = self.function(packed_fn) if packed_fn else (None, [])
                    parts.append(fn)
                    own_class_cells += cells
                namespace[member_name] = property(*parts)
                continue
            fn, cells = self.function(rest[0])
            own_class_cells += cells
            namespace[member_name] = {"staticmethod": staticmethod, "classmethod": classmethod}.get(kind, lambda f: f)(fn)
        cls = type(name, tuple(self.value(b) for b in bases), namespace)
        for cell in own_class_cells:
            cell.cell_contents = cls
        self.namespace[name] = cls
        return cls


class _LeftOut:
    """Stands where a value could not travel (inside a container, a default): any use says what it was."""

    def __init__(self, what: str):
        self._what = what

    def __getattr__(self, name):
        raise RuntimeError(f"this value stayed in the process that packed it: it was {self._what}")

    def __repr__(self) -> str:
        return f"<left out: {self._what}>"


def _rebuild_function(packed_globals, packed_function):
    return _Unpacker(packed_globals).function(packed_function)[0]


def _rebuild_instance(packed_globals, packed_class, state: bytes):
    cls = _Unpacker(packed_globals).klass(packed_class)
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))  # the instance's attributes travel as spawn sends them: pickled
    return obj


class _PortableFunction:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        packer = _Packer(self.fn.__globals__)
        packed = packer.function(self.fn)
        return _rebuild_function, (packer.globals, packed)


class _PortableDataset(Dataset):
    """Sends a dataset to a spawned worker the way spawn does, by pickling its attributes.

    The attributes travel as plain pickle bytes rather than through multiprocessing's
    shared-memory tensor sharing, which some sandboxed Linux kernels refuse; the
    worker receives the same copy either way.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __reduce__(self):
        cls, state = type(self.dataset), pickle.dumps(vars(self.dataset))
        if not _is_notebook_defined(cls):
            return _rebuild_importable_instance, (cls, state)
        any_method = next((m for m in vars(cls).values() if isinstance(m, types.FunctionType)), None)
        packer = _Packer(any_method.__globals__ if any_method else {})
        packed = packer.klass(cls)
        return _rebuild_instance, (packer.globals, packed, state)


def _rebuild_importable_instance(cls, state: bytes):
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))
    return obj


def portable(obj):
    """``obj``, made loadable by a spawned worker even if it was defined in a notebook cell."""
    if obj is None:
        return None
    if isinstance(obj, types.FunctionType) and _is_notebook_defined(obj):
        return _PortableFunction(obj)
    if isinstance(obj, Dataset) or (_is_notebook_defined(type(obj)) and hasattr(obj, "__dict__")):
        return _PortableDataset(obj) if hasattr(obj, "__dict__") else obj
    return obj
