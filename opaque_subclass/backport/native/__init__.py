"""Fixes shared by several native releases (torch >= 2.12), one module per
torch area. Each release's fix set (``v2_12``, ``v2_14``) lists the patches of
these modules with the fingerprint of that release's original."""
