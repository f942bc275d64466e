#!/usr/bin/env python3
"""bench/sass_loops's reading of a disassembly and of ptxas's report, on listings written here.

    test_sass_loops.py PATH_TO_bench/sass_loops

A kernel with a loop nested in a loop, both around HMMA, and a copy loop with no HMMA: only the
inner loop is reported, with its own instructions; a second kernel with no loop reports none.
"""
import importlib.machinery
import importlib.util
import sys

LISTING = '''
	code for sm_90
		Function : _Z6kernelv
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;       /* 0x0000000402047981 */
        /*0020*/                   LDSM.16.M88.4 R8, [R12] ;              /* 0x000000000c08783b */
        /*0030*/                   HMMA.16816.F32.BF16 R16, R8, R10, R16 ; /* 0x0000000a0810723c */
        /*0040*/                   HMMA.16816.F32.BF16 R20, R8, R11, R20 ; /* 0x0000000b0814723c */
        /*0050*/                   ISETP.NE.AND P0, PT, R3, RZ, PT ;      /* 0x000000ff0300720c */
        /*0060*/               @P0 BRA 0x20 ;                             /* 0xfffffffc00000947 */
        /*0070*/                   IADD3 R3, R3, 0x1, RZ ;                /* 0x0000000103037810 */
        /*0080*/              @!P1 BRA 0x10 ;                             /* 0xfffffffc00000947 */
        /*0090*/                   STS [R0], R4 ;                         /* 0x0000000400007388 */
        /*00a0*/               @P2 BRA 0x90 ;                             /* 0xfffffffc00000947 */
        /*00b0*/                   EXIT ;                                 /* 0x000000000000794d */
		..........

		Function : _Z5otherv
        /*0000*/                   FFMA R0, R1, R2, R3 ;                  /* 0x0000000201007223 */
        /*0010*/                   EXIT ;                                 /* 0x000000000000794d */
'''

PTXAS = '''ptxas info    : Compiling entry function '_Z6kernelv' for 'sm_90'
ptxas info    : Function properties for _Z6kernelv
    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 40960 bytes smem
ptxas info    : Compiling entry function '_Z5otherv' for 'sm_90'
ptxas info    : Function properties for _Z5otherv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers
'''


def main():
    loader = importlib.machinery.SourceFileLoader('sass_loops', sys.argv[1])
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader('sass_loops', loader))
    loader.exec_module(module)

    kernels = module.functions(LISTING)
    assert [name for name, _ in kernels] == ['_Z6kernelv', '_Z5otherv'], kernels
    kernel, other = kernels[0][1], kernels[1][1]
    assert len(kernel) == 12 and kernel[-1][1] == 'EXIT', kernel

    loops = module.work_loops(kernel)
    assert len(loops) == 1, loops  # the inner loop only; the copy loop at 0x90 has no HMMA
    assert (loops[0][0][0], loops[0][-1][0]) == (0x20, 0x60), loops
    counts = module.mix(loops[0])
    assert counts == {'LDSM': 1, 'HMMA': 2, 'ISETP': 1, 'BRA': 1}, counts
    assert module.work_loops(other) == []

    resources = module.ptxas_resources(PTXAS)
    assert resources == {'_Z6kernelv': '128 registers, 12 bytes spilled', '_Z5otherv': '8 registers, 0 bytes spilled'}, \
        resources
    print('bench/sass_loops: listings and ptxas reports read as expected')


if __name__ == '__main__':
    main()
