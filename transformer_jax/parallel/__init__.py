"""Parallelism: the device mesh, shardings from logical-axis rules, batches placed on the mesh,
multi-host start-up."""
