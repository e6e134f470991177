"""The KV offload tiers' lines of ``simulate``'s table (``serving.kvtiers.summary``)."""

from __future__ import annotations


def tiers_table(s: dict) -> str:
    """One line per tier: prompt tokens it served and their share of all prompt tokens,
    the lower tiers' capacity; then the loads and their seconds."""
    lines = [f"KV tiers ({s['write_policy']}, loads {s['overlap']}; host link "
             f"{s['link_bytes_per_s'] / 1e9:g} GB/s per direction):"]
    for tier in s["tiers"]:
        cap = s["capacity_blocks"].get(tier)
        room = "" if cap is None else f"  capacity {cap:,} blocks"
        lines.append(f"  {tier:4s} hit {s['hit_tokens'][tier]:>12,} tokens "
                     f"{s['hit_rate'][tier]:7.2%}{room}")
    lines.append(f"  loads {s['loads']:,}, {s['load_s'] * 1e3:.3f} ms in all")
    return "\n".join(lines)
