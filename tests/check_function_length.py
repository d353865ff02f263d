#!/usr/bin/env python3
"""Function-length check: no function body in src/ (*.cpp, *.hpp, *.cu, *.cuh) runs over 100 lines.

A function body is counted from the line of its opening brace to the line of its closing brace,
both included. Exit status 1, listing file:line, name and length of each one over the limit.
Usage: tests/check_function_length.py [REPOSITORY_ROOT]   (default: the folder above this script)

The heuristic, a brace-matching scan rather than a C++ parser:
- comments, string and character literals (raw strings too) and preprocessor lines (with their
  continuation lines) are blanked first, so their braces do not count;
- outside any function, a `{` opens a namespace, class, struct, union, enum or `extern ""` block
  when its prefix (the text since the last `;`, `{` or `}` at that level, less a leading
  `template <...>`) names one of those before any `(`; the scan goes on inside it;
- else the `{` opens a function body when its prefix holds a `(` with no `=` before it (other than
  in `operator=` and the like): a function, member function, constructor or operator definition;
  the body runs to the matching `}`, and what is inside it (lambdas, local classes) is its own;
- any other `{` there (a brace initialiser of a table or variable) is skipped to its match.
A constructor whose initialiser list holds a brace initialiser is measured from the `{` after it,
which can only make it look shorter; a lambda assigned at namespace scope is not measured.
"""

import pathlib
import re
import sys

LIMIT = 100
SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh"}
CONTAINER = re.compile(r'\b(namespace|class|struct|union|enum)\b|\bextern\s*""')
ASSIGNMENT = re.compile(r'(?<![=!<>+\-*/%&|^])=(?!=)')


def blank_code(text):
    """The text with comments, literals and preprocessor lines turned to spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            # A preprocessor line and its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        raw = re.match(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + raw.group(1) + '"', i + raw.end())
            end = n if end < 0 else end + len(raw.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i:end])[2:])
            i = end
            continue
        if c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def without_template_header(prefix):
    """The prefix less a leading `template <...>`, whose `class` and `typename` name no class."""
    match = re.match(r"template\s*<", prefix)
    if not match:
        return prefix
    depth, i = 1, match.end()
    while i < len(prefix) and depth:
        depth += {"<": 1, ">": -1}.get(prefix[i], 0)
        i += 1
    return without_template_header(prefix[i:].lstrip())


def is_container_prefix(prefix):
    prefix = without_template_header(prefix)
    keyword = CONTAINER.search(prefix)
    return bool(keyword) and "(" not in prefix[:keyword.start()]


def is_function_prefix(prefix):
    paren = prefix.find("(")
    if paren < 0:
        return False
    head = re.sub(r"\boperator\s*\S+", "operator", prefix[:paren])
    return not ASSIGNMENT.search(head)


def long_functions(path):
    """(line, name, length) of each function body in the file longer than LIMIT lines."""
    code = blank_code(path.read_text(encoding="utf-8", errors="replace"))
    found = []
    stack = []  # "container" or "skip" per open brace outside functions
    prefix_start = 0
    line = 1
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
        elif c in ";}":
            if c == "}" and stack:
                stack.pop()
            prefix_start = i + 1
        elif c == "{":
            prefix = " ".join(code[prefix_start:i].split())
            if is_container_prefix(prefix):
                stack.append("container")
                prefix_start = i + 1
            else:
                # A function body or a brace initialiser: either way, skip to the matching brace.
                start_line, depth, j = line, 0, i
                while j < n:
                    if code[j] == "\n":
                        line += 1
                    elif code[j] == "{":
                        depth += 1
                    elif code[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                length = line - start_line + 1
                if is_function_prefix(prefix) and length > LIMIT:
                    bare = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", prefix)
                    name = re.sub(r"\s*\(.*", "", bare).split(" ")[-1] or prefix[:60]
                    found.append((start_line, name, length))
                i = j
                prefix_start = i + 1
        i += 1
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    failures = 0
    for path in sorted((root / "src").rglob("*")):
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        for line, name, length in long_functions(path):
            print(f"{path.relative_to(root)}:{line}: {name} is {length} lines (at most {LIMIT})")
            failures += 1
    if failures:
        print(f"{failures} function(s) over {LIMIT} lines: split them along their steps")
        return 1
    print(f"no function in src/ over {LIMIT} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
