#!/usr/bin/env python3
# cu2cpp.py: one kernels/*.cu file -> the C++ that g++ compiles for the emulator (tests/gpu/emu/README.md), with
# tests/gpu/emu/emu_device.h included in front (g++ -include). Five rewrites, each checked, none changing the
# number of lines (checked: a report's kernel line is the .cu file's):
#   kernel<<<grid, block[, smem[, stream]]>>>(args)  ->  emu_launch("kernel", emu_kernel_id(kernel), EmuCfg(grid, block, ...),
#                                                         std::make_tuple(args), [=](const auto &...a) { kernel(a...); })
#   __shared__ T name[...];                           ->  static thread_local T name_emu_sets[EMU_BLOCK_SETS][...];
#                                                         auto &name = name_emu_sets[emu_shared_set(EMU_BLOCK_SETS)];
#                                                         emu_shared_poison(...)   (a copy per racecheck set; a
#                                                         reference, so a [=] lambda would copy the array: none does)
#   extern __shared__ T name[];                       ->  T *name = (T *)emu_dynamic_smem();
#   a function whose body holds inline PTX (asm)      ->  removed: emu_device.h has it under the same name
#   reinterpret_cast<T *>(e)                          ->  emu_pointer_cast<T *>(e): checked for T's alignment
# kernels/*.cuh go through it too (into the generated .cpp's directory, where "x.cuh" is looked for first).
# Anything else of CUDA's that g++ cannot read fails the build, which is the point: the emulator must grow with it.
# Usage: cu2cpp.py IN.cu OUT.cpp   or   cu2cpp.py IN.cuh OUT.cuh
import re
import sys


def blank_comments_and_strings(src):
    """The source with comments and string/char literals blanked (same length), for scanning structure."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            out[i:j] = ' ' * (j - i)
            i = j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == '\n' else ' ' for ch in src[i:j]]
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == '\\' else 1
            out[i + 1:j] = ' ' * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return ''.join(out)


def matching(text, i, open_ch, close_ch):
    """Index of the bracket closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    raise SystemExit(f'cu2cpp: unbalanced {open_ch} at offset {i}')


def top_level_chunks(scan):
    """(start, end) of each declaration or definition at namespace scope (inside namespace { } and extern "C" { }
    blocks too): a chunk ends at a ';' or a function body's '}' at depth 0."""
    chunks, start, depth, i, n, scopes = [], 0, 0, 0, len(scan), 0
    opener = re.compile(r'\s*(namespace\s*\w*|extern\s*"\s*")\s*\{')
    while i < n:
        c = scan[i]
        at_start = depth == 0 and scan[start:i].strip() == ''
        if at_start and c == '#':
            j = scan.find('\n', i)
            while j > 0 and scan[j - 1] == '\\':
                j = scan.find('\n', j + 1)
            j = n if j < 0 else j
            i = start = j + 1
            continue
        if at_start and not c.isspace():
            m = opener.match(scan, i)
            if m:
                scopes += 1
                i = start = m.end()
                continue
            if c == '}' and scopes:
                scopes -= 1
                i = start = i + 1
                continue
        if c in '({[':
            depth += 1
        elif c in ')}]':
            depth -= 1
            if depth == 0 and c == '}':
                rest = scan[i + 1:].lstrip()
                if not rest.startswith(';'):  # a function body ends the chunk; a struct's '};' ends below
                    chunks.append((start, i + 1))
                    start = i + 1
        elif c == ';' and depth == 0:
            chunks.append((start, i + 1))
            start = i + 1
        i += 1
    return chunks


def remove_ptx_functions(src):
    scan = blank_comments_and_strings(src)
    removed = []
    for start, end in reversed(top_level_chunks(scan)):
        body = scan[start:end]
        if re.search(r'\basm\b', body) and '{' in body:
            name = re.search(r'(\w+)\s*\(', body[:body.index('{')])
            removed.append(name.group(1) if name else '?')
            lines = src.count('\n', start, end)  # kept, so that #line numbers stay true
            src = src[:start] + f'/* cu2cpp: {removed[-1]} is emu_device.h\'s */' + '\n' * lines + src[end:]
    if re.search(r'\basm\b', blank_comments_and_strings(src)):
        raise SystemExit('cu2cpp: inline PTX outside a function of its own: give it a helper function')
    return src, removed


def rewrite_launches(src):
    out, pos = [], 0
    pattern = re.compile(r'([A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)\s*<<<')
    while True:
        scan = blank_comments_and_strings(src)
        m = pattern.search(scan, pos)
        if not m:
            break
        cfg_end = scan.index('>>>', m.end())
        paren = scan.index('(', cfg_end)
        if scan[cfg_end + 3:paren].strip():
            raise SystemExit(f'cu2cpp: cannot read the launch at offset {m.start()}')
        close = matching(scan, paren, '(', ')')
        kernel = src[m.start(1):m.end(1)]
        name = re.sub(r'\s+', ' ', kernel)
        cfg = src[m.end():cfg_end]
        args = src[paren + 1:close].strip()
        # the arguments are evaluated once, at the launch (as CUDA copies them then), into a tuple; NULL becomes
        # nullptr there (as an integer it would not convert to the kernel's pointer parameter)
        args = re.sub(r'\bNULL\b', 'nullptr', args)
        call = (f'emu_launch("{name}", emu_kernel_id({name}), EmuCfg({cfg}), std::make_tuple({args}), '
                f'[=](const auto &...a) {{ {name}(a...); }})')
        call += '\n' * (src.count('\n', m.start(), close + 1) - call.count('\n'))  # so that #line numbers stay true
        src = src[:m.start()] + call + src[close + 1:]
        pos = m.start() + len(call)
    return src


def rewrite_pointer_casts(src):
    """reinterpret_cast<T *>(e) -> emu_pointer_cast<T *>(e): checked for T's alignment (emu_device.h)."""
    return re.sub(r'\breinterpret_cast\s*<([^<>;()]*\*)\s*>', r'emu_pointer_cast<\1>', src)


def rewrite_shared(src):
    def dynamic(m):
        return f'{m.group(1).strip()} *{m.group(2)} = ({m.group(1).strip()} *)emu_dynamic_smem();'
    src, count = re.subn(r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([\w\s:]+?)\s*\b(\w+)\s*\[\s*\]\s*;',
                         dynamic, src)

    def static(m):
        decl = m.group(1)
        items = list(re.finditer(r'(\w+)\s*((?:\[[^\]]*\]\s*)+)(?:,|$)', decl))
        elem = decl[:items[0].start()].strip() if items else ''
        # one copy per racecheck set (emu_exec.cpp): only plain element types (no pointer or reference declarator,
        # no alignment, which would hold for the first copy only) and arrays without initialisers
        gaps = [decl[a.end():b.start()] for a, b in zip(items, items[1:])] + [decl[items[-1].end():] if items else '']
        if not items or not re.fullmatch(r'[A-Za-z_][\w\s:]*', elem) or any(g.strip() for g in gaps):
            raise SystemExit(f'cu2cpp: cannot read the shared declaration "__shared__ {decl};" (one copy a '
                             f'racecheck set: plain element types and arrays only)')
        out = []
        for it in items:
            n, dims = it.group(1), it.group(2).strip()
            out.append(f'static thread_local {elem} {n}_emu_sets[EMU_BLOCK_SETS]{dims}; '
                       f'auto &{n} = {n}_emu_sets[emu_shared_set(EMU_BLOCK_SETS)]; '
                       f'emu_shared_poison({n}, sizeof {n});')
        return ' '.join(out)
    src = re.sub(r'(?<!extern )__shared__\s+([^;]*);', static, src)
    if '__shared__' in blank_comments_and_strings(src):
        raise SystemExit('cu2cpp: a __shared__ declaration it cannot read')
    return src


def main():
    src = original = open(sys.argv[1]).read()
    src, removed = remove_ptx_functions(src)
    src = rewrite_launches(src)
    src = rewrite_shared(src)
    src = rewrite_pointer_casts(src)
    if src.count('\n') != original.count('\n'):  # the #line below would put reports on the wrong lines
        raise SystemExit(f'cu2cpp: {sys.argv[1]}: the rewrites changed the number of lines '
                         f'({original.count(chr(10))} -> {src.count(chr(10))})')
    header = f'// Generated by tests/gpu/emu/cu2cpp.py from {sys.argv[1]}; PTX helpers taken from emu_device.h: ' \
             f'{", ".join(sorted(removed)) or "none"}\n#line 1 "{sys.argv[1]}"\n'
    with open(sys.argv[2], 'w') as f:
        f.write(header + src)


if __name__ == '__main__':
    main()
