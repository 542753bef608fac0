"""``benchmarks/sass_loops.py`` on CPU: loops are found from backward branches, only innermost ones
with the wanted opcode are kept, and their instructions are classed as the docs' SASS comparison
reads them (a hand-written SASS listing, so the expected counts are known)."""

import pytest

SASS = """
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_1:
        /*0010*/                   UIADD3 UR4, UR4, 0x1, URZ ;
.L_x_2:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0030*/                   FSEL R1, R2, RZ, P0 ;
        /*0040*/                   LDS.64 R4, [R3] ;
        /*0050*/              @!P1 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 ;
        /*0060*/               @P0 BRA `(.L_x_2) ;
        /*0070*/                   STSM.16.M88.4 [R5], R8 ;
        /*0080*/                   BRA `(.L_x_1) ;
.L_x_3:
        /*0090*/                   IMAD R1, R1, 0x2, RZ ;
        /*00a0*/                   BRA `(.L_x_3) ;
        /*00b0*/                   BRA `(.L_x_4) ;
.L_x_4:
        /*00c0*/                   EXIT ;
"""


@pytest.fixture(scope="module")
def tool(load_script):
    return load_script("sass_loops")


def test_parse_keeps_order_and_labels(tool):
    insns, labels = tool.parse(SASS)
    assert len(insns) == 13
    assert labels == {".L_x_1": 1, ".L_x_2": 2, ".L_x_3": 9, ".L_x_4": 12}
    assert tool.opcode(insns[5]) == "BAR.SYNC.DEFER_BLOCKING"  # guard predicate dropped


def test_innermost_loop_with_hgmma_and_its_classes(tool):
    insns, labels = tool.parse(SASS)
    loops = tool.innermost_loops(insns, labels, "HGMMA")
    # .L_x_1's loop holds .L_x_2's (not innermost); .L_x_3's has no HGMMA; .L_x_4's branch is forward
    assert [(lp["start"], lp["end"], lp["length"]) for lp in loops] == [(2, 6, 5)]
    assert loops[0]["classes"] == {"wgmma": 1, "shared ld/st": 1, "fp32 / cvt": 1, "sync / barrier": 1, "branch": 1}
    every = tool.innermost_loops(insns, labels, "")
    assert [(lp["start"], lp["end"]) for lp in every] == [(2, 6), (9, 10)]
    assert every[1]["classes"] == {"integer / move / predicate": 1, "branch": 1}


@pytest.mark.parametrize("op, cls", [("UIADD3", "uniform"), ("UTMALDG", "global / async copy"),
                                     ("STG.E", "global / async copy"), ("LDSM.16.MT88.4", "shared ld/st"),
                                     ("PRMT", "integer / move / predicate"), ("XYZ", "other")])
def test_op_classes(tool, op, cls):
    assert tool.op_class(op) == cls
