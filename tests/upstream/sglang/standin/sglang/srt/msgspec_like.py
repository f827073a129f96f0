"""A stand-in for ``msgspec.Struct`` (msgspec is not installable here): what SGLang's request
structs look like to a plug-in after the migration (sgl-project/sglang PR #28688,
io_struct.py ``BaseReq(msgspec.Struct, tag=True, kw_only=True, array_like=True)``).

Reproduced: ``__struct_fields__`` (the field names, base classes first), ``__slots__`` and no
``__dict__`` (so ``vars(req)`` raises TypeError as it does on a real Struct), keyword-only
construction with defaults, equality by fields, pickling. ``asdict`` is msgspec.structs.asdict.
"""

import copy


class _StructMeta(type):
    def __new__(mcs, name, bases, ns, **options):
        own = [k for k in ns.get("__annotations__", {}) if not k.startswith("_")]
        inherited = [f for b in bases for f in getattr(b, "__struct_fields__", ())]
        defaults = {}
        for b in bases:
            defaults.update(getattr(b, "__struct_defaults__", {}))
        for k in own:
            if k in ns:
                defaults[k] = ns.pop(k)
        ns["__slots__"] = tuple(own)
        ns["__struct_fields__"] = tuple(inherited + [k for k in own if k not in inherited])
        ns["__struct_defaults__"] = defaults
        ns["__struct_config__"] = dict(options)
        return super().__new__(mcs, name, bases, ns)

    def __init__(cls, name, bases, ns, **options):
        super().__init__(name, bases, ns)


class Struct(metaclass=_StructMeta):
    __slots__ = ()

    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(self.__struct_fields__)
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) {sorted(unknown)}")
        for name in self.__struct_fields__:
            if name in kwargs:
                value = kwargs[name]
            elif name in self.__struct_defaults__:
                value = copy.copy(self.__struct_defaults__[name])
            else:
                raise TypeError(f"Missing required argument '{name}'")
            object.__setattr__(self, name, value)

    def __eq__(self, other):
        return type(self) is type(other) and asdict(self) == asdict(other)

    def __repr__(self):
        return (
            f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__struct_fields__)})"
        )

    def __reduce__(self):
        return (_rebuild, (type(self), asdict(self)))


def _rebuild(cls, values):
    return cls(**values)


def asdict(struct):
    return {name: getattr(struct, name) for name in struct.__struct_fields__}
