"""Checks a SASS dump for writes to registers an in-flight register-A HGMMA group still reads.

Usage: cuobjdump -sass -fun flex_fwd kernel.cubin > k.sass; python3 check_wgmma_hazards.py k.sass
A P V-like product takes P from registers; until the wgmma group is waited for
(WARPGROUP.DEPBAR.LE gsb0, 0x0) neither those registers nor the accumulators may be written.
ptxas reused them once in an overlapped flex forward (wrong results on the H200), so
check the SASS of any kernel that does work between a wgmma issue and its wait."""
import re, sys
lines = open(sys.argv[1]).read().split('\n')
ins = []
for l in lines:
    m = re.search(r'/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m: ins.append(m.group(2).strip())
bad = 0; groups = 0
i = 0
while i < len(ins):
    x = ins[i]
    m = re.match(r'HGMMA\.\S+ R(\d+), R(\d+), gdesc', x)
    if m and 'gsb0' in x:
        # the whole group: walk back to collect A regs of this group's HGMMAs
        acc = int(m.group(1)); a_regs = set(); k = i
        while k >= 0 and ins[k].startswith('HGMMA') and re.match(r'HGMMA\.\S+ R(\d+), R(\d+), gdesc', ins[k]):
            mm = re.match(r'HGMMA\.\S+ R(\d+), R(\d+), gdesc', ins[k]); a_regs |= set(range(int(mm.group(2)), int(mm.group(2)) + 4)); k -= 1
        n = int(re.search(r'x(\d+)x', x).group(1))
        acc_regs = set(range(acc, acc + n // 2))
        groups += 1
        for idx, y in enumerate(ins[i + 1:], start=i + 1):
            # a wait right after an unconditional branch is another path's (if / else): skip it
            if 'DEPBAR.LE gsb0, 0x0' in y and not re.match(r'BRA ', ins[idx - 1]): break
            parts = re.sub(r'^@!?U?P\w+\s+', '', y).split(None, 1)
            if len(parts) < 2 or parts[0].startswith(('ST', 'BRA', 'BAR', 'HGMMA', 'WARPGROUP', 'RED', 'ATOM', 'ISETP', 'FSETP', 'BSSY', 'BSYNC', 'EXIT', 'WARPSYNC', 'VOTE', 'DEPBAR', 'LDGDEPBAR', 'PLOP3')):
                if len(parts) >= 2 and parts[0].startswith('HGMMA'): break  # next group issue
                continue
            d = re.match(r'R(\d+)', parts[1])
            if d and (int(d.group(1)) in a_regs or int(d.group(1)) in acc_regs):
                bad += 1
                if bad <= 5: print('write to in-flight reg:', y[:100])
    i += 1
print(f'{groups} register-A HGMMA groups checked, {bad} hazards')
