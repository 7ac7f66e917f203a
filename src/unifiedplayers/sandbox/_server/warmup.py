"""Regular-expression warm-up: a source's literal patterns compiled once in the forker, before its calls fork
(:func:`warm_regexes`)."""
import re

# re functions -> index of their ``flags`` argument
_RE_FLAGS_ARG = {"compile": 1, "match": 2, "search": 2, "fullmatch": 2, "findall": 2, "finditer": 2,
                 "split": 3, "sub": 4, "subn": 4}
PyCF_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST, without importing ast into every call's parent


def _re_flags(node):
    """The value of a flags expression made of ``re.X`` names, ``|`` and integers, else None."""
    kind = type(node).__name__
    if kind == "Constant" and type(node.value) is int:
        return node.value
    if kind == "Attribute" and type(node.value).__name__ == "Name" and node.value.id == "re":
        flag = getattr(re, node.attr, None)
        return int(flag) if isinstance(flag, re.RegexFlag) else None
    if kind == "BinOp" and type(node.op).__name__ == "BitOr":
        left, right = _re_flags(node.left), _re_flags(node.right)
        return None if left is None or right is None else left | right
    return None


def _literal_patterns(source):
    """(pattern, flags) of every ``re.<function>("literal", ...)`` call in ``source``."""
    found, stack = [], [compile(source, "<source>", "exec", PyCF_ONLY_AST)]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "Call":
            func, args = node.func, node.args
            if (type(func).__name__ == "Attribute" and func.attr in _RE_FLAGS_ARG
                    and type(func.value).__name__ == "Name" and func.value.id == "re"
                    and args and type(args[0]).__name__ == "Constant"
                    and type(args[0].value) in (str, bytes)):
                at = _RE_FLAGS_ARG[func.attr]
                flags = _re_flags(args[at]) if len(args) > at else 0
                for kw in node.keywords:
                    if kw.arg == "flags":
                        flags = _re_flags(kw.value)
                if flags is not None:
                    found.append((args[0].value, flags))
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                stack.extend(v for v in value if hasattr(v, "_fields"))
            elif hasattr(value, "_fields"):
                stack.append(value)
    return found


def warm_regexes(source):
    """Compile the literal regular expressions of ``source`` into ``re``'s cache in the forker, so that no call of
    that source pays for them in its own fork."""
    try:
        for pattern, flags in _literal_patterns(source)[:32]:
            try:
                re.compile(pattern, flags)
            except (re.error, TypeError, ValueError, OverflowError, RecursionError):
                pass
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
