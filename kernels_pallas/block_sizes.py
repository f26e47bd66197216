"""Choosing tile sizes that divide the array dimensions (Triton needs power-of-two tiles)."""


def fit_block(dim: int, preferred: int) -> int:
    """The largest power of two <= preferred that divides dim (1 if dim is odd).

    Triton tiles must be powers of two, and the kernels tile k, n, head_dim and cache length without edge
    masks, so a tile must divide its dimension. Row dimensions (m, t) are masked and need no fitting.
    """
    block = 1
    while block * 2 <= min(preferred, dim) and dim % (block * 2) == 0:
        block *= 2
    return block


def row_block(dim: int, preferred: int, minimum: int = 16) -> int:
    """A power-of-two tile for a masked row dimension: preferred, shrunk towards dim but not below minimum."""
    block = preferred
    while block // 2 >= max(dim, minimum):
        block //= 2
    return block


def check_triton_tiles(interpret: bool, **tiles: int) -> None:
    """Raises a readable error when a compiled (non-interpret) kernel would get an invalid Triton tile.

    Triton tensors must have power-of-two sizes and its dots need operands at least 16 wide, so the tiled
    dimensions (k, n, head_dim, ...) must be divisible by 16. Interpret mode has no such limit.
    """
    if interpret:
        return
    bad = {name: size for name, size in tiles.items() if size < 16 or size & (size - 1)}
    if bad:
        raise ValueError(
            f"Triton tiles {bad} are not powers of two >= 16: the tiled dimensions must be divisible by 16"
        )


def matmul_tiles(
    interpret: bool, m: int, k: int, n: int, block_m: int, block_k: int, block_n: int
) -> dict[str, int]:
    """block_m / block_k / block_n for a grouped-matmul kernel from their upper bounds: the row tile shrunk
    towards m, the k and n tiles fitted to divide k and n (and checked for Triton unless interpreting)."""
    tiles = dict(block_m=row_block(m, block_m), block_k=fit_block(k, block_k), block_n=fit_block(n, block_n))
    check_triton_tiles(interpret, block_k=tiles["block_k"], block_n=tiles["block_n"])
    return tiles
