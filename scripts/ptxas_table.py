#!/usr/bin/env python3
"""Resource table of every CUDA kernel in kernels/cuda/ from ptxas: registers, spills, shared memory,
and the theoretical occupancy they allow with the block size and dynamic shared memory of the launch.
Standard library only; needs nvcc (the CUDA toolkit) and c++filt (binutils), no GPU.

    python3 scripts/ptxas_table.py                 # Markdown tables for sm_80 and sm_90 on stdout
    python3 scripts/ptxas_table.py --arch 90       # one architecture (about half the time)
    python3 scripts/ptxas_table.py --write-docs    # regenerate the marked section of docs/cuda.md
    python3 scripts/ptxas_table.py --check         # exit 1 naming every training-path kernel that spills
    python3 scripts/ptxas_table.py --self-test     # the parser and the checks on a captured sample

Each kernels/cuda/*.cu is compiled once per architecture, `nvcc -std=c++17 -I<repo> -Xptxas -v
-arch=sm_XX -cubin` (device code only: no host compiler pass), and ptxas's "info" lines are parsed.
The launch block size and dynamic shared memory are read from the `<<<grid, block, smem, stream>>>`
launch sites in kernels/cuda/ (expressions such as `kThreads`, `32 * kRowWarps` or `F::kSmem` of
`using F = FwdTiles<D>` are evaluated from the constexpr definitions in the sources); a kernel
launched by a library (CUB's radix sort in embedding.cu) takes the block size of its
`__launch_bounds__` (the PTX's `.maxntid`). A kernel with neither gets "?" and a warning; --check
still reports its spills.
"""

import argparse
import dataclasses
import datetime
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_DIR = os.path.join("kernels", "cuda")
DOC = os.path.join("docs", "cuda.md")
BEGIN, END = "<!-- ptxas-table:begin -->", "<!-- ptxas-table:end -->"


# Per-SM limits. CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
# (compute capabilities 8.0 and 9.0: 64K 32-bit registers per SM, 255 per thread, 2048 resident
# threads = 64 warps, 32 resident blocks; shared memory per SM 164 KB (8.0) and 228 KB (9.0), per
# block at most 163 KB and 227 KB), and its "Shared Memory" sections of compute capabilities 8.x and
# 9.0 ("the 1 KB of shared memory not made available to a thread block is reserved for system use").
# The allocation rules are those of the toolkit's occupancy calculator, cuda_occupancy.h
# (cudaOccMaxBlocksPerSMRegsLimit, cudaOccMaxBlocksPerSMSmemLimit): registers are allocated per
# warp in units of 256, within each of the SM's 4 sub-partitions (a quarter of the register file);
# shared memory per block is static + dynamic + the 1 KB reserve, rounded up to 128 bytes. The
# shared-memory limit assumes the largest carveout (the driver picks the carveout; these are the
# upper bounds a kernel can get).
@dataclasses.dataclass(frozen=True)
class ArchLimits:
    name: str
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers per warp are rounded up to this
    sub_partitions: int = 4
    max_warps_per_sm: int = 64  # 2048 threads
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 0
    max_smem_per_block: int = 0
    smem_reserved_per_block: int = 1024
    smem_alloc_unit: int = 128


ARCHS = {
    80: ArchLimits("A100", smem_per_sm=164 * 1024, max_smem_per_block=163 * 1024),
    90: ArchLimits("H100/H200", smem_per_sm=228 * 1024, max_smem_per_block=227 * 1024),
}

# Kernels that are not on the training path, with the reason; --check ignores their spills. Empty:
# every kernel in kernels/cuda/ is (the bf16 attention kernels are the attention path of a bf16
# model and of the benchmark; CUB's EmptyKernel is never launched but cannot spill).
OFF_TRAINING_PATH = {}

# Friendlier names for template arguments.
SHORT_TYPES = {"__nv_bfloat16": "bf16", "unsigned int": "uint32", "unsigned short": "uint16"}
LIBRARY_PREFIXES = ("cub::", "thrust::")


@dataclasses.dataclass
class Function:
    mangled: str
    arch: int
    entry: bool  # a __global__ kernel (ptxas "Compiling entry function"), else a called function
    regs: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0  # static shared memory, bytes
    frame_seen: bool = False  # ptxas's "N bytes stack frame, N bytes spill stores, ..." line was read
    maxntid: int = 0  # __launch_bounds__'s block size from the PTX, 0 if none
    source: str = ""  # kernels/cuda/<file>.cu
    demangled: str = ""
    name: str = ""  # friendly: base<short template args>
    base: str = ""
    targs: list = dataclasses.field(default_factory=list)
    block: object = None  # int, or None when unknown
    block_from: str = ""  # "launch", "bounds" or ""
    dyn_smem: object = None
    occupancy: object = None  # Occupancy, or None

    @property
    def spills(self):
        return self.spill_stores > 0 or self.spill_loads > 0


# ------------------------------------------------------------------ ptxas output
_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for 'sm_(\d+)'")
_FUNC = re.compile(r"ptxas info\s*: Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"ptxas info\s*: Used (\d+) registers(.*)")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text, default_arch=0):
    """ptxas -v's info lines -> [Function]: one per entry, plus any called function with a frame."""
    funcs, by_name, current, props_for = [], {}, None, None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = Function(m.group(1), int(m.group(2)), entry=True)
            funcs.append(current)
            by_name[current.mangled] = current
            props_for = None
            continue
        m = _FUNC.search(line)
        if m:
            props_for = by_name.get(m.group(1))
            if props_for is None:  # a non-inlined device function: its own frame and spills
                props_for = Function(m.group(1), current.arch if current else default_arch, entry=False)
                funcs.append(props_for)
                by_name[props_for.mangled] = props_for
            continue
        m = _FRAME.search(line)
        if m and props_for is not None:
            props_for.stack, props_for.spill_stores, props_for.spill_loads = map(int, m.groups())
            props_for.frame_seen = True
            continue
        m = _USED.search(line)
        if m and current is not None:
            current.regs = int(m.group(1))
            s = _SMEM.search(m.group(2))
            current.smem = int(s.group(1)) if s else 0
    return funcs


_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")
_MAXNTID = re.compile(r"\.(?:maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def parse_maxntid(ptx):
    """PTX -> {mangled entry: threads per block of its .maxntid/.reqntid} (__launch_bounds__)."""
    out, name = {}, None
    for line in ptx.splitlines():
        m = _PTX_ENTRY.search(line)
        if m:
            name = m.group(1)
            continue
        if name:
            m = _MAXNTID.search(line)
            if m:
                out[name] = math.prod(int(g) for g in m.groups() if g)
                name = None
            elif line.startswith("{"):
                name = None  # the body started: no launch bounds
    return out


def demangle(names):
    if not names:
        return {}
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
        out = r.stdout.splitlines()
        if len(out) == len(names):
            return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        pass
    warn("c++filt (binutils) not found or failed: kernel names stay mangled")
    return {n: n for n in names}


def split_top(s, sep=","):
    """Splits s at sep outside (), [], {} and <>."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _strip_namespaces(s):
    s = s.replace("(anonymous namespace)::", "")
    return re.sub(r"\b(?:\w+::)+(?=\w)", "", s)


def friendly_name(demangled):
    """'void tessera::cuda::(anonymous namespace)::fwd_bf16_kernel<64>(bf16*, ...)' ->
    ('fwd_bf16_kernel<64>', 'fwd_bf16_kernel', ['64']); CUB's kernels keep a 'cub::' prefix and
    long template arguments become '<...>'."""
    s = demangled.replace("(anonymous namespace)", "(anon)")
    if s.startswith("void "):
        s = s[5:]
    depth, cut = 0, len(s)  # the parameter list: the first '(' outside template arguments
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not s.startswith("(anon)", i):
            cut = i
            break
    qual = s[:cut].replace("(anon)", "(anonymous namespace)")
    lt = qual.find("<")
    path, targs_text = (qual, "") if lt < 0 else (qual[:lt], qual[lt + 1 : qual.rfind(">")])
    base = path.split("::")[-1]
    prefix = next((p for p in LIBRARY_PREFIXES if path.startswith(p)), "")
    targs = [_strip_namespaces(a) for a in split_top(targs_text)] if targs_text else []
    targs = [SHORT_TYPES.get(a, a).replace(" >", ">") for a in targs]
    shown = ", ".join(targs)
    if len(shown) > 28:
        shown = "..."
    name = prefix + base + (f"<{shown}>" if targs else "")
    return name, base, targs


# ------------------------------------------------------------------ sources: constants and launches
class EvalError(Exception):
    pass


SIZEOF = {"bf16": 2, "__nv_bfloat16": 2, "half": 2, "__half": 2, "float": 4, "double": 8, "int": 4, "unsigned": 4,
          "int32_t": 4, "uint32_t": 4, "int64_t": 8, "uint64_t": 8, "size_t": 8, "uint16_t": 2, "int16_t": 2,
          "char": 1, "int8_t": 1, "uint8_t": 1, "float2": 8, "float4": 16, "double2": 16, "long": 8}
CASTS = {"size_t", "int", "unsigned", "long", "int64_t", "uint64_t", "int32_t", "uint32_t", "unsigned long"}
_TOKEN = re.compile(r"\s*(?:(\d+)[uUlL]*|([A-Za-z_]\w*(?:::\w+)*)|(<=|>=|==|!=|&&|\|\||<<|>>|[-+*/%()?:<>!,]))")
_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, ">": 4, "<=": 4, ">=": 4, "<<": 5, ">>": 5, "+": 6, "-": 6,
         "*": 7, "/": 7, "%": 7}


def evaluate(expr, lookup):
    """The integer value of a C++ constant expression (arithmetic, comparisons, ?:, sizeof of a
    known type, function-style and static_cast casts); lookup(name) gives a name's value or raises."""
    toks, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise EvalError(f"cannot read {expr[pos:]!r}")
        pos = m.end()
        if m.group(1) is not None:
            toks.append(("num", int(m.group(1))))
        elif m.group(2) is not None:
            toks.append(("id", m.group(2)))
        elif m.group(3) is not None:
            toks.append(("op", m.group(3)))
    i = 0

    def peek():
        return toks[i] if i < len(toks) else ("end", None)

    def take(kind=None, val=None):
        nonlocal i
        t = peek()
        if (kind and t[0] != kind) or (val is not None and t[1] != val):
            raise EvalError(f"expected {val or kind} in {expr!r}")
        i += 1
        return t

    def ternary():
        c = binary(1)
        if peek() == ("op", "?"):
            take()
            a = ternary()
            take("op", ":")
            b = ternary()
            return a if c else b
        return c

    def binary(min_prec):
        left = unary()
        while peek()[0] == "op" and _PREC.get(peek()[1], 0) >= min_prec:
            op = take()[1]
            right = binary(_PREC[op] + 1)
            left = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
                    "/": lambda a, b: int(a / b), "%": lambda a, b: a - b * int(a / b),
                    "<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b),
                    ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
                    "&&": lambda a, b: int(bool(a and b)), "||": lambda a, b: int(bool(a or b)),
                    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b}[op](left, right)
        return left

    def unary():
        t = peek()
        if t in (("op", "-"), ("op", "+"), ("op", "!")):
            take()
            v = unary()
            return -v if t[1] == "-" else (int(not v) if t[1] == "!" else v)
        return primary()

    def type_until(close):
        words = []
        while peek() != ("op", close):
            if peek()[0] == "end":
                raise EvalError(f"unclosed type in {expr!r}")
            words.append(str(take()[1]))
        return " ".join(words)

    def primary():
        t = take()
        if t[0] == "num":
            return t[1]
        if t == ("op", "("):
            v = ternary()
            take("op", ")")
            return v
        if t[0] == "id":
            if t[1] == "sizeof":
                take("op", "(")
                ty = type_until(")")
                take("op", ")")
                if ty not in SIZEOF:
                    raise EvalError(f"sizeof({ty}) unknown")
                return SIZEOF[ty]
            if t[1] == "static_cast":
                take("op", "<")
                type_until(">")
                take("op", ">")
                take("op", "(")
                v = ternary()
                take("op", ")")
                return v
            if t[1] in CASTS and peek() == ("op", "("):
                take()
                v = ternary()
                take("op", ")")
                return v
            return lookup(t[1])
        raise EvalError(f"unexpected {t[1]!r} in {expr!r}")

    v = ternary()
    if peek()[0] != "end":
        raise EvalError(f"trailing {peek()[1]!r} in {expr!r}")
    return v


def strip_comments(text):
    """Removes // and /* */ comments, keeping line breaks (line numbers stay right)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\])*\"", blank, text, flags=re.S)


_STRUCT = re.compile(r"template\s*<\s*(?:int|size_t|unsigned)\s+(\w+)\s*>\s*struct\s+(\w+)\s*\{")
_CONSTEXPR = re.compile(r"constexpr\s+(?:unsigned\s+|signed\s+)?(?:int|size_t|long|int64_t|int32_t|uint32_t|float|"
                        r"double|auto|unsigned)\s+([^;]+);")
_LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*(<[\w\s,:]*>)?\s*<<<(.*?)>>>", re.S)
_USING = re.compile(r"using\s+(\w+)\s*=\s*(\w+)\s*<([^<>;]*)>\s*;")
_INCLUDE = re.compile(r'#include\s+"(kernels/cuda/[\w.]+)"')


def _declarators(body):
    out = {}
    for m in _CONSTEXPR.finditer(body):
        for d in split_top(m.group(1)):
            if "=" in d:
                name, value = d.split("=", 1)
                out[name.strip()] = value.strip()
    return out


def _block_end(text, brace):
    depth = 0
    for j in range(brace, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


@dataclasses.dataclass
class SourceFile:
    path: str  # relative to the repository
    text: str  # without comments
    constants: dict  # name -> expression (file scope, function-local constexprs too)
    structs: dict  # name -> (template parameter, {member: expression})
    includes: list


def read_source(repo, rel):
    with open(os.path.join(repo, rel), encoding="utf-8") as f:
        raw = f.read()
    text = strip_comments(raw)  # (string literals blanked too: the includes are read from raw)
    structs, outside, last = {}, [], 0
    for m in _STRUCT.finditer(text):
        end = _block_end(text, m.end() - 1)
        structs[m.group(2)] = (m.group(1), _declarators(text[m.end():end]))
        outside.append(text[last:m.start()])
        last = end
    outside.append(text[last:])
    return SourceFile(rel, text, _declarators("".join(outside)), structs, _INCLUDE.findall(raw))


@dataclasses.dataclass
class Launch:
    source: SourceFile
    line: int
    pos: int
    targs: list
    block: str
    smem: str


def find_launches(sources):
    """{kernel base name: [Launch]} over every kernels/cuda/ file."""
    out = {}
    for src in sources.values():
        for m in _LAUNCH.finditer(src.text):
            args = split_top(" ".join(m.group(3).split()))
            if len(args) < 2:
                continue
            targs = [a.strip() for a in split_top(m.group(2)[1:-1])] if m.group(2) else []
            out.setdefault(m.group(1), []).append(
                Launch(src, src.text.count("\n", 0, m.start()) + 1, m.start(), targs, args[1],
                       args[2] if len(args) > 2 else "0"))
    return out


class Resolver:
    """Evaluates a launch's block and shared-memory expressions for one kernel instance."""

    def __init__(self, sources):
        self.sources = sources

    def scopes(self, src):
        """The file, then what it includes (transitively), for constant lookup."""
        seen, order, todo = set(), [], [src.path]
        while todo:
            p = todo.pop(0)
            if p in seen or p not in self.sources:
                continue
            seen.add(p)
            order.append(self.sources[p])
            todo.extend(self.sources[p].includes)
        return order

    def value(self, launch, expr, env):
        """expr at the launch site: env (the instance's template arguments), then `Alias::member` of
        a `using Alias = Struct<arg>;` before the launch, then the constexprs of the file and its
        includes."""
        scopes = self.scopes(launch.source)
        aliases = {m.group(1): (m.group(2), m.group(3)) for m in _USING.finditer(launch.source.text[: launch.pos])}

        def outer(name, depth=0):
            if depth > 50:
                raise EvalError(f"{name}: definitions nest too deep")
            if name in env:
                return env[name]
            if "::" in name:
                alias, member = name.rsplit("::", 1)
                struct, arg = aliases.get(alias, (alias, None))
                for s in scopes:
                    if struct not in s.structs:
                        continue
                    param, members = s.structs[struct]
                    bound = {} if arg is None else {param: evaluate(arg, lambda n: outer(n, depth + 1))}

                    def inner(n, d=depth + 1):
                        if d > 50:
                            raise EvalError(f"{n}: definitions nest too deep")
                        if n in bound:
                            return bound[n]
                        if n in members:
                            return evaluate(members[n], lambda m: inner(m, d + 1))
                        return outer(n, d + 1)

                    return inner(member)
                raise EvalError(f"{name}: no struct {struct}")
            for s in scopes:
                if name in s.constants:
                    return evaluate(s.constants[name], lambda n: outer(n, depth + 1))
            raise EvalError(f"{name} not found")

        return evaluate(expr, outer)

    def resolve(self, fn, launches):
        """Sets fn.block and fn.dyn_smem from its launch sites (the same file, then the files it
        includes), else from __launch_bounds__ for a library kernel."""
        src = self.sources.get(fn.source)
        sites = []
        if src:
            paths = [s.path for s in self.scopes(src)]
            sites = [l for l in launches.get(fn.base, []) if l.source.path in paths]
        blocks, smems = set(), set()
        for l in sites:
            env = {}
            for a, v in zip(l.targs, fn.targs):
                if re.fullmatch(r"[A-Za-z_]\w*", a) and re.fullmatch(r"\d+", v):
                    env[a] = int(v)  # a template parameter bound by this instance (D = 64)
            if l.targs and len(l.targs) == len(fn.targs) and not env and not self._same_types(l.targs, fn.targs):
                continue  # a launch of another instance (delta_kernel<float> for delta_kernel<bf16>)
            try:
                blocks.add(self.value(l, l.block, env))
                smems.add(self.value(l, l.smem, env))
            except EvalError as e:
                warn(f"{fn.source}:{l.line}: {fn.name}: cannot evaluate the launch ({e}): block size unknown")
                blocks.add(None)
                smems.add(None)
        if len(blocks) == 1 and None not in blocks:
            fn.block, fn.block_from = blocks.pop(), "launch"
        elif len(blocks) > 1:
            warn(f"{fn.name} ({fn.source}): launch sites disagree on the block size {sorted(map(str, blocks))}")
        elif fn.maxntid:
            fn.block, fn.block_from = fn.maxntid, "bounds"
        if len(smems) == 1 and None not in smems:
            fn.dyn_smem = smems.pop()
        elif not sites and fn.block_from == "bounds":
            fn.dyn_smem = 0  # a library kernel: CUB's kernels use static shared memory
        if fn.block is None and not sites and fn.entry and not fn.name.startswith(LIBRARY_PREFIXES):
            warn(f"{fn.name} ({fn.source}): no launch site found, block size unknown (occupancy '?')")

    @staticmethod
    def _same_types(a, b):
        norm = lambda t: SHORT_TYPES.get(t, t).replace(" ", "")
        return [norm(x) for x in a] == [norm(x) for x in b]


# ------------------------------------------------------------------ occupancy
@dataclasses.dataclass
class Occupancy:
    blocks: int  # resident blocks per SM
    warps: int  # resident warps per SM
    limiters: list  # what gives `blocks`: "registers", "shared memory", "warps", "blocks"


def occupancy(lim, regs, block, smem_static, smem_dynamic):
    """Theoretical blocks and warps per SM, as cuda_occupancy.h computes them (largest carveout)."""
    warps_per_block = -(-block // 32)
    limits = {"warps": lim.max_warps_per_sm // warps_per_block, "blocks": lim.max_blocks_per_sm}
    if regs > 0:
        regs_per_warp = -(-regs * 32 // lim.reg_alloc_unit) * lim.reg_alloc_unit
        warps_per_partition = (lim.regs_per_sm // lim.sub_partitions) // regs_per_warp
        # the hardware's per-block check counts the warps rounded up to a multiple of the sub-partitions
        warps_assumed = -(-warps_per_block // lim.sub_partitions) * lim.sub_partitions
        too_many = regs > lim.max_regs_per_thread or regs_per_warp * warps_assumed > lim.regs_per_sm
        limits["registers"] = 0 if too_many else warps_per_partition * lim.sub_partitions // warps_per_block
    smem = smem_static + smem_dynamic
    per_block = -(-(smem + lim.smem_reserved_per_block) // lim.smem_alloc_unit) * lim.smem_alloc_unit
    limits["shared memory"] = 0 if smem > lim.max_smem_per_block else lim.smem_per_sm // per_block
    blocks = min(limits.values())
    order = ["registers", "shared memory", "warps", "blocks"]
    return Occupancy(blocks, blocks * warps_per_block, [k for k in order if limits.get(k) == blocks])


# ------------------------------------------------------------------ compiling
def warn(msg):
    print(f"ptxas_table: warning: {msg}", file=sys.stderr)


def nvcc_version(nvcc):
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return f"{m.group(1)} ({m.group(2)})" if m else out.strip().splitlines()[-1]


def nvcc_command(nvcc, repo, arch, src, extra, out):
    return [nvcc, "-std=c++17", f"-I{repo}", "-Xptxas", "-v", f"-arch=sm_{arch}", "-cubin", "--keep", "--keep-dir",
            os.path.dirname(out), *extra, "-o", out, src]


def compile_one(nvcc, repo, arch, src, extra):
    """ptxas's info for one file and one architecture -> ([Function], error text or None)."""
    with tempfile.TemporaryDirectory(prefix="ptxas_table.") as tmp:
        cmd = nvcc_command(nvcc, repo, arch, src, extra, os.path.join(tmp, "out.cubin"))
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
        if r.returncode != 0:
            return [], f"{' '.join(cmd)}\n{r.stdout}{r.stderr}"
        funcs = parse_ptxas(r.stdout + r.stderr, arch)
        bounds = {}
        for name in os.listdir(tmp):
            if name.endswith(".ptx"):
                with open(os.path.join(tmp, name), encoding="utf-8", errors="replace") as f:
                    bounds.update(parse_maxntid(f.read()))
        for fn in funcs:
            fn.maxntid = bounds.get(fn.mangled, 0)
            fn.source = os.path.relpath(os.path.abspath(os.path.join(repo, src)), repo)
        return funcs, None


def collect(nvcc, repo, archs, files, extra, jobs):
    """Compiles every file for every arch; returns ([Function] named and resolved, [errors])."""
    tasks = [(a, f) for a in archs for f in files]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda t: compile_one(nvcc, repo, t[0], t[1], extra), tasks))
    funcs = [fn for fs, _ in results for fn in fs]
    errors = [e for _, e in results if e]
    names = demangle(sorted({fn.mangled for fn in funcs}))
    sources = {}
    for p in sorted(set(files) | set(_headers(repo))):
        try:
            sources[p] = read_source(repo, p)
        except OSError:
            pass
    resolver, launches = Resolver(sources), find_launches(sources)
    for fn in funcs:
        fn.demangled = names.get(fn.mangled, fn.mangled)
        fn.name, fn.base, fn.targs = friendly_name(fn.demangled)
    _disambiguate(funcs)
    for fn in funcs:
        if fn.entry:
            resolver.resolve(fn, launches)
            if fn.block:
                fn.occupancy = occupancy(ARCHS[fn.arch], fn.regs, fn.block, fn.smem, fn.dyn_smem or 0)
    return funcs, errors


def _disambiguate(funcs):
    """Two kernels of one file and arch with the same short name keep their full template arguments."""
    seen = {}
    for fn in funcs:
        seen.setdefault((fn.arch, fn.source, fn.name), []).append(fn)
    for group in seen.values():
        if len(group) > 1:
            for fn in group:
                if fn.name.endswith("<...>"):
                    fn.name = fn.name[:-5] + "<" + ", ".join(fn.targs) + ">"


def _headers(repo):
    d = os.path.join(repo, KERNEL_DIR)
    return [os.path.join(KERNEL_DIR, n) for n in sorted(os.listdir(d)) if n.endswith((".cuh", ".h"))]


def kernel_files(repo):
    d = os.path.join(repo, KERNEL_DIR)
    return [os.path.join(KERNEL_DIR, n) for n in sorted(os.listdir(d)) if n.endswith(".cu")]


# ------------------------------------------------------------------ output
def table(funcs, arch):
    lim = ARCHS[arch]
    rows = sorted((f for f in funcs if f.arch == arch and f.entry), key=lambda f: (f.source, f.name))
    out = [f"| Kernel | File | Block | Regs | Spill st/ld (B) | Stack (B) | Static smem (B) | Dyn smem (B) | Blocks/SM "
           f"| Warps/SM (of {lim.max_warps_per_sm}) | Limited by |",
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for f in rows:
        block = "?" if f.block is None else f"{f.block}{'*' if f.block_from == 'bounds' else ''}"
        dyn = "?" if f.dyn_smem is None else str(f.dyn_smem)
        if f.occupancy is None:
            blocks = warps = limit = "?"
        else:
            o = f.occupancy
            blocks, warps = str(o.blocks), f"{o.warps} ({100 * o.warps // lim.max_warps_per_sm}%)"
            limit = "full" if o.warps == lim.max_warps_per_sm else ", ".join(o.limiters)
            one_more = occupancy(lim, f.regs + 1, f.block, f.smem, f.dyn_smem or 0).warps
            if one_more < o.warps:
                limit += f"; 1 more register: {one_more}"
        spill = f"**{f.spill_stores}/{f.spill_loads}**" if f.spills else "0/0"
        out.append(f"| `{f.name}` | {os.path.basename(f.source)} | {block} | {f.regs} | {spill} | {f.stack} "
                   f"| {f.smem} | {dyn} | {blocks} | {warps} | {limit} |")
    others = [f for f in funcs if f.arch == arch and not f.entry and (f.stack or f.spills)]
    for f in others:
        out.append(f"\nCalled function `{f.name}` ({f.source}): {f.stack} bytes stack frame, "
                   f"{f.spill_stores}/{f.spill_loads} bytes spill stores/loads.")
    return "\n".join(out)


def report(funcs, archs, command, version):
    parts = []
    for a in archs:
        lim = ARCHS[a]
        parts.append(f"**sm_{a}** ({lim.name}: {lim.regs_per_sm} registers, {lim.smem_per_sm // 1024} KB shared "
                     f"memory (at most {lim.max_smem_per_block // 1024} KB per block), {lim.max_warps_per_sm} warps "
                     f"and {lim.max_blocks_per_sm} blocks per SM)\n\n" + table(funcs, a))
    notes = ("`*` block size from the kernel's `__launch_bounds__` (CUB launches its kernels itself, with that "
             "size; their dynamic shared memory is 0). `?`: no launch in kernels/cuda/ that the script could "
             "read. "
             "Spills are bytes per thread (ptxas's spill stores/loads). Shared memory per block counts 1 KB "
             "the system reserves; the occupancy assumes the largest shared-memory carveout. Limited by: the "
             "resources whose limit gives that many blocks (registers, shared memory, warps: the SM's 64, "
             "blocks: the SM's 32), or \"full\" (64 warps); \"1 more register: N\" where one more register per "
             "thread would lower the warps per SM to N.")
    head = f"Generated by `{command}` with nvcc {version}; each kernels/cuda/*.cu compiled with " \
           f"`nvcc -std=c++17 -I. -Xptxas -v -arch=sm_XX -cubin`."
    return head + "\n\n" + "\n\n".join(parts) + "\n\n" + notes + "\n"


def write_docs(repo, body):
    path = os.path.join(repo, DOC)
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    b, e = doc.find(BEGIN), doc.find(END)
    if b < 0 or e < b:
        sys.exit(f"ptxas_table: {DOC} has no '{BEGIN}' ... '{END}' section")
    stamp = datetime.date.today().isoformat()
    new = doc[: b + len(BEGIN)] + f"\n{stamp}. " + body + doc[e:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"ptxas_table: wrote {DOC}", file=sys.stderr)


def check(funcs):
    """Lines naming each training-path function that spills, or a kernel that cannot launch."""
    bad = []
    for f in sorted(funcs, key=lambda f: (f.arch, f.source, f.name)):
        where = f"sm_{f.arch} {os.path.basename(f.source)} {f.name}"
        if f.name in OFF_TRAINING_PATH or f.base in OFF_TRAINING_PATH:
            continue
        if f.entry and not f.frame_seen:  # ptxas's format changed: never pass silently
            bad.append(f"UNREAD   {where}: no spill line in ptxas's output for this kernel")
        if f.spills:
            kind = "kernel" if f.entry else "called function"
            regs = f", {f.regs} registers" if f.entry else ""
            bad.append(f"SPILLS   {where} ({kind}): {f.spill_stores} bytes spill stores, {f.spill_loads} bytes "
                       f"spill loads{regs}")
        if f.occupancy is not None and f.occupancy.blocks == 0:
            bad.append(f"NO BLOCK {where}: not one block of {f.block} threads fits an SM "
                       f"({f.regs} registers, {f.smem + (f.dyn_smem or 0)} bytes shared memory)")
    return bad


# ------------------------------------------------------------------ self-test
# Captured ptxas output with spills: `nvcc -std=c++17 -I. -Xptxas -v -arch=sm_90 -cubin -maxrregcount=16`
# of kernels/cuda/attention.cu (fwd_f32_kernel) and kernels/cuda/rope.cu (nvcc 13.0, 2026-12-05),
# with attention's fwd_bf16_kernel<64> from the normal build: a spilling kernel, a spilling called
# function (CUDA's pow, not inlined under the cap), a kernel with a stack frame but no spills, and
# a clean one with shared memory. `--check --extra-flags=-maxrregcount=16` gives the same on the
# real files.
SAMPLE = r"""ptxas warning : For profile sm_90 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for '_ZN7tessera4cuda45_GLOBAL__N__d6073761_12_attention_cu_2f8a664414fwd_f32_kernelEPfS2_PKfS4_S4_NS1_3GeoE' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN7tessera4cuda45_GLOBAL__N__d6073761_12_attention_cu_2f8a664414fwd_f32_kernelEPfS2_PKfS4_S4_NS1_3GeoE' for 'sm_90'
ptxas info    : Function properties for _ZN7tessera4cuda45_GLOBAL__N__d6073761_12_attention_cu_2f8a664414fwd_f32_kernelEPfS2_PKfS4_S4_NS1_3GeoE
    112 bytes stack frame, 140 bytes spill stores, 136 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 112 bytes cumulative stack size
ptxas info    : Compile time = 18.908 ms
ptxas info    : Compiling entry function '_ZN7tessera4cuda45_GLOBAL__N__d6073761_12_attention_cu_2f8a664415fwd_bf16_kernelILi64EEEvP13__nv_bfloat16PfPKS3_S7_S7_NS1_3GeoE' for 'sm_90'
ptxas info    : Function properties for _ZN7tessera4cuda45_GLOBAL__N__d6073761_12_attention_cu_2f8a664415fwd_bf16_kernelILi64EEEvP13__nv_bfloat16PfPKS3_S7_S7_NS1_3GeoE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 146 registers, used 1 barriers
ptxas info    : Compile time = 104.216 ms
ptxas warning : For profile sm_90 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for '_ZN7tessera4cuda39_GLOBAL__N__95b83ac1_7_rope_cu_f08c1cd011rope_kernelEPfPKfllllldf' with  24 of maxrregcount option
ptxas info    : 144 bytes gmem
ptxas info    : Compiling entry function '_ZN7tessera4cuda39_GLOBAL__N__95b83ac1_7_rope_cu_f08c1cd011rope_kernelEPfPKfllllldf' for 'sm_90'
ptxas info    : Function properties for _ZN7tessera4cuda39_GLOBAL__N__95b83ac1_7_rope_cu_f08c1cd011rope_kernelEPfPKfllllldf
    104 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 104 bytes cumulative stack size, 4096 bytes smem
ptxas info    : Compile time = 61.508 ms
ptxas info    : Function properties for __internal_accurate_pow
    0 bytes stack frame, 60 bytes spill stores, 60 bytes spill loads
ptxas info    : Function properties for __internal_trig_reduction_slowpathd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def self_test():
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    funcs = parse_ptxas(SAMPLE)
    expect("functions parsed", [(f.entry, f.regs, f.stack, f.spill_stores, f.spill_loads, f.smem) for f in funcs],
           [(True, 24, 112, 140, 136, 0), (True, 146, 0, 0, 0, 0), (True, 24, 104, 0, 0, 4096),
            (False, 0, 0, 60, 60, 0), (False, 0, 0, 0, 0, 0)])
    expect("arch", {f.arch for f in funcs}, {90})
    names = ["fwd_f32_kernel", "fwd_bf16_kernel<64>", "rope_kernel", "__internal_accurate_pow",
             "__internal_trig_reduction_slowpathd"]  # c++filt's work, not needed for the check
    for f, name in zip(funcs, names):
        f.source, f.name = KERNEL_DIR + "/x.cu", name
    bad = check(funcs)
    expect("check names the spilling kernel and called function", [b.split()[3] for b in bad],
           ["__internal_accurate_pow", "fwd_f32_kernel"])
    expect("check of a clean file", check(funcs[1:3]), [])
    expect("check of an unread kernel", [b.split()[0] for b in check(parse_ptxas(SAMPLE.replace("bytes stack frame",
                                                                                          "B stack")))],
           ["UNREAD", "UNREAD", "UNREAD"])
    for f in funcs:
        f.occupancy = occupancy(ARCHS[90], f.regs, 32 * 1024, 0, 0) if f.entry else None
    expect("check names a kernel that cannot launch", [b.split()[0] for b in check(funcs[1:2])], ["NO"])
    expect("friendly", friendly_name("void tessera::cuda::(anonymous namespace)::fwd_bf16_kernel<64>("
                                     "__nv_bfloat16*, float*, tessera::cuda::(anonymous namespace)::Geo)"),
           ("fwd_bf16_kernel<64>", "fwd_bf16_kernel", ["64"]))
    expect("friendly, type", friendly_name("void tessera::cuda::(anonymous namespace)::delta_kernel<__nv_bfloat16>"
                                           "(float*, __nv_bfloat16 const*)")[0], "delta_kernel<bf16>")
    expect("friendly, nested", friendly_name("void tessera::cuda::(anonymous namespace)::partial_sums_kernel<"
                                             "tessera::cuda::(anonymous namespace)::SumOf<float> >(double*, long)")[0],
           "partial_sums_kernel<SumOf<float>>")
    expect("friendly, CUB", friendly_name("void cub::CUB_300001_SM_900::detail::radix_sort::DeviceRadixSortOnesweep"
                                          "Kernel<cub::CUB_300001_SM_900::detail::radix::policy_hub<unsigned int, int, "
                                          "unsigned int>::Policy1000, (cub::CUB_300001_SM_900::SortOrder)0>(int*)")[0],
           "cub::DeviceRadixSortOnesweepKernel<...>")
    expect("friendly, plain", friendly_name("tessera::cuda::(anonymous namespace)::iota_kernel(int*, long)")[0],
           "iota_kernel")
    expect("maxntid", parse_maxntid(".visible .entry _Z1kv(\n)\n.maxntid 384, 1, 1\n{\n.entry _Z1jv(\n)\n{\n"),
           {"_Z1kv": 384})
    consts = {"kWarps": "4", "kPad": "8", "D": 128}
    look = lambda n: consts[n] if isinstance(consts[n], int) else evaluate(consts[n], look)
    expect("evaluate", evaluate("sizeof(bf16) * (2 * size_t(16 * kWarps) * (D + kPad)) + 2 * sizeof(float) * "
                                "(D >= 128 ? 32 : 64)", look), 2 * 2 * 64 * 136 + 2 * 4 * 32)
    expect("evaluate, C division", evaluate("-7 / 2 + 7 % 3", look), -3 + 1)
    src = SourceFile("k.cu", "template <int D>\nvoid f() {\n  using F = Tiles<D>;\n  k<D><<<g, 32 * kRowWarps, "
                     "F::kSmem, st>>>(x);\n}\n", {"kRowWarps": "4", "kPad": "8"},
                     {"Tiles": ("D", {"Br": "D >= 128 ? 32 : 64", "kSmem": "sizeof(float) * Br * (D + kPad)"})}, [])
    fn = Function("k", 90, True, regs=64, source="k.cu", name="k<128>", base="k", targs=["128"])
    Resolver({"k.cu": src}).resolve(fn, find_launches({"k.cu": src}))
    expect("launch block", fn.block, 128)
    expect("launch smem", fn.dyn_smem, 4 * 32 * 136)
    sm90, sm80 = ARCHS[90], ARCHS[80]
    # 244 registers x 32 -> 7808, rounded to 7936 per warp; 16384 per sub-partition / 7936 = 2 warps,
    # 8 per SM = 2 blocks of 4 warps; shared memory would allow 228 KB / (53248 + 1024) = 4.
    expect("occupancy, registers", dataclasses.astuple(occupancy(sm90, 244, 128, 0, 53248)), (2, 8, ["registers"]))
    expect("occupancy, smem", occupancy(sm80, 128, 128, 0, 79872).blocks, 2)
    expect("occupancy, smem limits", occupancy(sm80, 64, 128, 0, 79872).limiters, ["shared memory"])
    expect("occupancy, warps", dataclasses.astuple(occupancy(sm90, 32, 256, 0, 0)), (8, 64, ["registers", "warps"]))
    expect("occupancy, blocks cap", occupancy(sm90, 16, 32, 0, 0).limiters, ["blocks"])
    expect("occupancy, too much smem", occupancy(sm80, 32, 128, 0, 170000).blocks, 0)
    if failures:
        print("ptxas_table --self-test FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"ptxas_table --self-test: ok; the captured sample fails the check as it should:\n  " + "\n  ".join(bad))
    return 0


# ------------------------------------------------------------------ main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", type=int, choices=sorted(ARCHS),
                    help="an architecture (80, 90); repeat for several; default all")
    ap.add_argument("--nvcc", default=None, help="nvcc to use (default: $CUDACXX, PATH, /usr/local/cuda/bin/nvcc)")
    ap.add_argument("--sources", nargs="+", help="compile these .cu files instead of kernels/cuda/*.cu")
    ap.add_argument("--extra-flags", default="", help="more nvcc flags, e.g. '-maxrregcount=16' to force spills")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="compiles at once (default 1)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a training-path kernel spills (or cannot launch)")
    ap.add_argument("--write-docs", action="store_true", help=f"replace the marked section of {DOC}")
    ap.add_argument("--self-test", action="store_true", help="test the parser and the check on a captured sample")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    archs = args.arch or sorted(ARCHS)
    nvcc = args.nvcc or os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    version = nvcc_version(nvcc)
    if version is None:
        print(f"ptxas_table: nvcc not found ({nvcc})", file=sys.stderr)
        return 2
    files = [os.path.relpath(os.path.abspath(p), REPO) for p in args.sources] if args.sources else kernel_files(REPO)
    start = time.monotonic()
    funcs, errors = collect(nvcc, REPO, archs, files, shlex.split(args.extra_flags), args.jobs)
    elapsed = time.monotonic() - start
    for e in errors:
        print(f"ptxas_table: compile failed:\n{e}", file=sys.stderr)
    print(f"ptxas_table: {len(files)} files x {len(archs)} archs, {sum(f.entry for f in funcs)} kernels, "
          f"{elapsed:.1f} s (nvcc {version})", file=sys.stderr)
    if errors:
        return 2
    if args.check:
        bad = check(funcs)
        for a in archs:
            for path in files:
                with open(os.path.join(REPO, path), encoding="utf-8") as f:
                    has_kernels = "__global__" in f.read()
                if has_kernels and not any(fn.arch == a and fn.source == path and fn.entry for fn in funcs):
                    bad.append(f"UNREAD   sm_{a} {os.path.basename(path)}: has __global__ functions, but no kernel "
                               "was read from ptxas's output")
        for b in bad:
            print(b)
        if bad:
            print(f"ptxas_table --check: {len(bad)} problem(s); see docs/cuda.md, \"Kernel resources (ptxas)\"")
            return 1
        print(f"ptxas_table --check: no spills in {sum(f.entry for f in funcs)} kernels "
              f"({', '.join(f'sm_{a}' for a in archs)})")
        return 0
    command = "scripts/ptxas_table.py" + ("" if args.arch is None else "".join(f" --arch {a}" for a in archs))
    body = report(funcs, archs, command + (" --write-docs" if args.write_docs else ""), version)
    if args.write_docs:
        write_docs(REPO, body)
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
