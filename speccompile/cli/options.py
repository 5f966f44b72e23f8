"""Click options generated from the config classes (runtime/options.py), never written by hand.

A command takes a config class's options with ``@config_options(Class, "name", command)``
and receives them as one dict ``name`` (field -> value), which becomes the config object.
Defaults, help and flags are the fields'; ranges are checked when the object is made, so a
bad value gets the same message from the CLI, ``--overrides`` and the Python API.
"""
from __future__ import annotations

import functools

import click

from speccompile.runtime.options import Option, options_of


def click_option(opt: Option, command: str):
    default = opt.default_for(command)
    kwargs = {"default": None if default == () else default, "help": opt.help, "show_default": default not in (None, ())}
    if opt.kind is bool:  # a "--x/--no-x" pair (the field's flag names both)
        flag = opt.flag if "/" in opt.flag else f"{opt.flag}/--no-{opt.flag[2:]}"
        return click.option(flag, opt.name, **kwargs)
    if opt.choices:
        kwargs["type"] = click.Choice(opt.choices)
    elif opt.kind in (int, float):
        kwargs["type"] = opt.kind
    return click.option(opt.flag, opt.name, **kwargs)


def flagged(cls, command: str) -> list[Option]:
    """The options of ``cls`` that ``command`` takes as flags."""
    return [o for o in options_of(cls) if o.flag and command in o.commands]


def config_options(cls, group: str, command: str):
    """Add ``cls``'s flags for ``command``; the function receives them as the dict ``group``.
    A flag's parameter is the field's name (the runtime commands read ``ctx.params`` by it), so
    the classes one command takes share no field names."""
    opts = flagged(cls, command)

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return f(*args, **{group: {o.name: kwargs.pop(o.name) for o in opts}}, **kwargs)

        for opt in reversed(opts):
            wrapper = click_option(opt, command)(wrapper)
        return wrapper

    return decorate
