"""``batch.RowTile``, the program of the row-wise kernels (rope, the RMS norms): nothing the
interpreter runs sees its size (any tile gives the same outputs), so a tile past ``ROW_TILE`` passed
every other CPU test while on sm_90 V4-Flash's query rope (128 rows x 512) spilled 2,688 bytes."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels.batch import ROW_TILE, RowTile

WIDTHS = (1, 2, 3, 16, 40, 64, 130, 512, 520, 1024, 1030, 4096, 4097, 16384)  # powers of two and not


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@pytest.mark.parametrize("per_thread", [8, 16])  # rope's, the norms'
@pytest.mark.parametrize("width", WIDTHS)
def test_a_tile_holds_whole_padded_rows_within_row_tile_unless_one_row_is_wider(width, per_thread):
    tile = RowTile.of(width, per_thread)
    assert _power_of_two(tile.side) and width <= tile.side < 2 * width
    assert _power_of_two(tile.rows)
    assert tile.rows * tile.side <= ROW_TILE or tile.rows == 1  # the cap (registers, spills)
    assert 2 * tile.rows * tile.side > ROW_TILE  # as many rows as fit
    assert _power_of_two(tile.warps) and tile.warps <= 16
    per = tile.rows * tile.side / (32 * tile.warps)  # elements a thread
    assert per >= per_thread or tile.warps == 1
    assert per <= per_thread or tile.warps == 16


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 12, 300])
def test_a_calls_rows_change_neither_its_tile_nor_so_a_rows_sum_order(count):
    """q_norm's 1024-wide rows: the tile shrunk to a call's rows was one row over 2 warps for one
    token, four over 8 for four or more: another layout on sm_90, so another order for a row's RMS sum
    between decode and prefill. Every call takes four rows over 8 warps now."""
    from dayzero.kernels import norms

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append((meta["ROWS"], meta["BD"], meta["num_warps"]))

    x = torch.zeros(count, 1024)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(norms, "_rms_kernel", Recorder())
        norms._launch(x, None, 1e-6)
    assert launched == [(4, 1024, 8)]


def test_v4_flash_query_rope_takes_the_tiles_compiled_for_sm90():
    """64 heads of 512 a token: 8 rows over 16 warps (51-57 registers, no spills on sm_90)."""
    assert RowTile.of(512, per_thread=8) == RowTile(8, 512, 16)
    assert RowTile.of(16384, per_thread=16) == RowTile(1, 16384, 16)  # the streams' norm: a row
