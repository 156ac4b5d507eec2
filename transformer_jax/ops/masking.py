"""The logit that hides a position: added where attention may not look and where a token may
not be chosen. exp() of it is exactly 0 in f32, and sums of a few of them stay finite."""

NEG_INF = -1e9
