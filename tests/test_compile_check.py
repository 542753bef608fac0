"""CPU tests of ``compile_check.inflight_operand_writes`` on hand-written SASS: a write to an RS wgmma's
A-operand registers between a partial wait and the next wait is found (the pattern of the racy
forward build of 2026-12-04); writes elsewhere, or to other registers, are not."""

from fastvideo_cute.compile_check import inflight_operand_writes

_ISSUE = """\
        /*0100*/                   HGMMA.64x64x16.F32.BF16 R56, gdesc[UR16], RZ, !UPT, gsb0 ;
        /*0110*/                   HGMMA.64x128x16.F32.BF16 R24, R120, gdesc[UR8].tnspB, R24 ;
        /*0120*/                   HGMMA.64x128x16.F32.BF16 R24, R124, gdesc[UR12].tnspB, R24, gsb0 ;
        /*0130*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
"""
_WAIT = "        /*0200*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"


def test_a_write_to_the_operand_before_the_wait_is_found():
    racy = _ISSUE + "        /*0140*/                   FFMA R125, R99, UR8, R7 ;\n" + _WAIT
    assert inflight_operand_writes(racy) == ["/*0140*/                   FFMA R125, R99, UR8, R7 ;"]


def test_a_wide_write_is_checked_by_its_width():
    racy = _ISSUE + "        /*0140*/                   LDS.128 R124, [R3] ;\n" + _WAIT
    assert len(inflight_operand_writes(racy)) == 1
    beside = _ISSUE + "        /*0140*/                   LDS.128 R116, [R3] ;\n" + _WAIT  # R116-R119
    assert inflight_operand_writes(beside) == []


def test_reads_other_registers_and_writes_after_the_wait_are_not():
    safe = (_ISSUE + "        /*0140*/                   FFMA R60, R120, UR8, R7 ;\n"
            "        /*0150*/                   STS [R120], R121 ;\n" + _WAIT
            + "        /*0210*/                   F2FP.BF16.F32.PACK_AB R120, R57, R56 ;\n")
    assert inflight_operand_writes(safe) == []
