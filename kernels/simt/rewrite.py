#!/usr/bin/env python3
"""The SIMT emulator's source step (-DTESSERA_SIMT=ON): kernels/cuda's .cu and .cuh files as C++
that g++ compiles against the stand-in headers of kernels/simt/include. Three rewrites, each kept on
its own lines (a #line directive keeps every diagnostic and sanitizer report at the .cu's lines):

  kernel<<<grid, block, smem, stream>>>(args)
      -> ::tessera::simt::launcher("kernel", kernel, ::tessera::simt::launch_config(grid, block, smem, stream))(args)
  __shared__ T name[N]...;            (a static shared array in a kernel)
      -> static const char name_simt_key = 0; T (&name)[N]... = ::tessera::simt::shared_array<T[N]...>(&name_simt_key);
  extern __shared__ __align__(a) T name[];
      -> T* const name = ::tessera::simt::dynamic_shared_as<T>();

It also lists every __global__ kernel it sees (the coverage check's denominator:
scripts/simt_check.sh prints "kernels exercised: X of Y"). Anything else in the sources is left as
it is, so the CUDA build and this one compile the same text.

usage: rewrite.py --src-root ROOT --out-root OUT --kernel-list FILE  FILE.cu|FILE.cuh ...
"""
import argparse
import os
import re
import sys

STATIC_SHARED = re.compile(
    r"^(?P<indent>\s*)__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?(?P<type>[A-Za-z_][\w:<>, ]*?)\s+"
    r"(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]+\])+)\s*;(?P<rest>.*)$")
EXTERN_SHARED = re.compile(
    r"^(?P<indent>\s*)extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?(?P<type>[A-Za-z_][\w:<>, ]*?)\s+"
    r"(?P<name>\w+)\s*\[\s*\]\s*;(?P<rest>.*)$")
GLOBAL_DEF = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
TEMPLATE_GLOBAL_DEF = re.compile(
    r"template\s*<[^>]*>\s*__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


class RewriteError(Exception):
    pass


def kernel_start(text, end):
    """Index where the kernel expression ending just before `end` (the <<<) begins: an identifier
    with optional :: qualification and template arguments."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    while True:
        if i > 0 and text[i - 1] == ">":  # template arguments: back to the matching <
            depth = 0
            while i > 0:
                i -= 1
                if text[i] == ">":
                    depth += 1
                elif text[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
            if depth != 0:
                raise RewriteError("unbalanced template arguments before <<<")
        j = i
        while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
            j -= 1
        if j == i:
            raise RewriteError("no kernel name before <<<")
        i = j
        if i >= 2 and text[i - 2:i] == "::":
            i -= 2
            continue
        return i


def config_end(text, start):
    """Index of the >>> closing the launch configuration that starts at `start`."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(">>>", i):
            return i
        i += 1
    raise RewriteError("<<< without >>>")


def base_name(expr):
    name = expr.split("<", 1)[0].strip()
    return name.split("::")[-1]


def rewrite_launches(text, path, templates):
    """templates: the names of kernels that are function templates. A launch of one without
    explicit template arguments deduces them from the arguments, so it goes through a generic
    lambda (the call deduces as the <<<>>> launch would); any other kernel is passed by address,
    which is also the key of its attributes (cudaFuncSetAttribute)."""
    out = []
    pos = 0
    while True:
        k = text.find("<<<", pos)
        if k < 0:
            out.append(text[pos:])
            return "".join(out)
        line = text.count("\n", 0, k) + 1
        line_start = text.rfind("\n", 0, k) + 1
        if "//" in text[line_start:k]:  # in a comment
            out.append(text[pos:k + 3])
            pos = k + 3
            continue
        try:
            s = kernel_start(text, k)
            e = config_end(text, k + 3)
        except RewriteError as err:
            raise RewriteError(f"{path}:{line}: {err}")
        expr = text[s:k].strip()
        config = text[k + 3:e]
        newlines = config.count("\n")  # keep the line count: the launch may span lines
        config = config.replace("\n", " ")
        out.append(text[pos:s])
        name = base_name(expr)
        if name in templates and "<" not in expr:
            kernel = f"[](auto... simt_args) {{ {expr}(simt_args...); }}"
        else:
            kernel = expr
        out.append(f'::tessera::simt::launcher("{name}", {kernel}, '
                   f"::tessera::simt::launch_config({config}))" + "\n" * newlines)
        pos = e + 3


def rewrite_shared(text, path):
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if "__shared__" not in line:
            continue
        m = EXTERN_SHARED.match(line)
        if m:
            lines[n] = (f"{m['indent']}{m['type']}* const {m['name']} = "
                        f"::tessera::simt::dynamic_shared_as<{m['type']}>();{m['rest']}")
            continue
        m = STATIC_SHARED.match(line)
        if m:
            t, name, dims = m["type"], m["name"], m["dims"]
            lines[n] = (f"{m['indent']}static const char {name}_simt_key = 0; "
                        f"{t} (&{name}){dims} = ::tessera::simt::shared_array<{t}{dims}>(&{name}_simt_key);"
                        f"{m['rest']}")
            continue
        stripped = line.strip()
        if stripped.startswith("//") or stripped.startswith("*"):
            continue
        raise RewriteError(f"{path}:{n + 1}: a __shared__ declaration this step does not know: {stripped}")
    return "\n".join(lines)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src-root", required=True)
    ap.add_argument("--out-root", required=True)
    ap.add_argument("--kernel-list", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    kernels = set()
    templates = set()
    for f in args.files:
        with open(f, encoding="utf-8") as fh:
            templates.update(TEMPLATE_GLOBAL_DEF.findall(strip_comments(fh.read())))
    try:
        for f in args.files:
            rel = os.path.relpath(os.path.abspath(f), os.path.abspath(args.src_root))
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            kernels.update(GLOBAL_DEF.findall(strip_comments(text)))
            body = rewrite_launches(rewrite_shared(text, rel), rel, templates)
            out_rel = rel[:-3] + ".cpp" if rel.endswith(".cu") else rel
            out = os.path.join(args.out_root, out_rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            src_abs = os.path.abspath(f)
            new = f'#line 1 "{src_abs}"\n' + body
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(new)
    except RewriteError as err:
        print(f"simt rewrite: {err}", file=sys.stderr)
        return 1
    with open(args.kernel_list, "w", encoding="utf-8") as fh:
        fh.write("".join(k + "\n" for k in sorted(kernels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
