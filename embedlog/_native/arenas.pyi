def install(limit_bytes: int) -> None:
    """Keep up to limit_bytes of pymalloc's free arenas for reuse; 0 gives them back."""
def stats() -> dict[str, int]:
    """{'kept', 'kept_bytes', 'limit', 'hits', 'misses', 'returned'}."""
