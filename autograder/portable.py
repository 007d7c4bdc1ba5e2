"""Ship functions and classes defined in a notebook cell to a spawned worker process.

Under ``spawn`` (Windows; Python 3.14 makes ``forkserver`` Linux's default) a DataLoader worker is
a new interpreter that can only import objects from modules, so a function or class defined in a
notebook cell cannot be loaded there. ``portable`` ships such an object by value (its compiled
code and the module-level names it uses) and the worker rebuilds it; a dataset *instance* still
travels by pickling, exactly as spawn does it, so a generator built in ``__init__`` arrives as a copy.
"""

from __future__ import annotations

import builtins
import marshal
import pickle
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


class _Unpacker:
    def __init__(self, packed_globals: dict):
        self.namespace = {"__builtins__": builtins, "__name__": "__main__"}
        self.packed = packed_globals
        for name in packed_globals:
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
        return pickle.loads(encoded[1])

    def function(self, packed) -> tuple[types.FunctionType, list]:
        code, name, qualname, defaults, kwdefaults, cells = packed
        closure = tuple(types.CellType() if c[0] == "own_class" else types.CellType(self.value(c)) for c in cells)
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
