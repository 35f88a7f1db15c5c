"""A rank that raises under torch's @record, which writes the exception to the file torchrun
names in TORCHELASTIC_ERROR_FILE."""

from torch.distributed.elastic.multiprocessing.errors import record


def load_shard(n: int) -> None:
    raise ValueError(f"bad shard {n}")


@record
def main() -> None:
    load_shard(7)


if __name__ == "__main__":
    main()
