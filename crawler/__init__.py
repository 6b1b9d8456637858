"""crawler: a single-PC web crawler on kvstore (see DESIGN.md section 4)."""
