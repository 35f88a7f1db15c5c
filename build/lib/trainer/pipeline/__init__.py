"""The input pipeline: datasets for every --data kind, the sharded sampler, the loaders and their
workers' fork server, the prefetchers and GPU JPEG decode, and corrupt-sample skipping."""
