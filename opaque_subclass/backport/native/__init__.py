"""Fixes shared by several native releases (torch >= 2.12), one module per
torch area. Each release's fix set (``v2_12`` to ``v2_15``; ``v2_11``'s patch
set too) lists the patches of these modules with the fingerprint of that
release's original."""
