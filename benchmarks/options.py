"""The benchmark settings shared by the CLI, the sub-benchmarks and the worker processes they start."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Options"]


@dataclass(frozen=True)
class Options:
    """Command-line settings; None means "the sub-benchmark's default" (see `python -m benchmarks --help`).

    Attributes:
        model: conf/model option (step/peers default swin_tiny; overhead default: run.py's, swin_micro).
        batch: data.batch_size (step/peers 4; data 64; overhead: the config's).
        img_size: data.img_size (step/peers/data 224; overhead: the config's).
        num_classes: Classes of the head for step/peers (data.num_classes).
        iters: Timed iterations (rounds) per candidate.
        warmup: Untimed rounds after the first (compiling) call.
        seed: Weights and batch of every variant.
        overrides: Hydra overrides applied to every variant, e.g. ("optimizer.lr=1e-4", "hardware.mode=pynative").
        variants: step: presets or override lists, the first is the reference of the ratio column.
        max_resident: step: variants compiled per process (0 = all in this process); each group of at most this
            many runs in its own process with the reference first, for hosts too small to hold them all.
        images: data: JPEG files per split.
        source_size: data: "WxH" of those JPEGs (e.g. 500x375, an ImageNet-sized photo); None: img_size square.
        workers: data: measure 1..workers pipeline workers.
        kills: chaos: SIGKILLs of the training, each followed by a resume.
        step_ms: loader: the train step time (ms) a card's feed must sustain, at `batch` images per step.
    """

    model: str | None = None
    batch: int | None = None
    img_size: int | None = None
    num_classes: int = 1000
    iters: int = 5
    warmup: int = 3
    seed: int = 0
    overrides: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    max_resident: int = 0
    images: int = 512
    source_size: str | None = None
    workers: int = 2
    kills: int = 3
    step_ms: float = 454.0

    def model_overrides(self, model: str | None, batch: int | None, img_size: int | None) -> list[str]:
        """model=..., data.batch_size=..., data.img_size=...: the options given, else the defaults passed here."""
        chosen = {"model": self.model or model, "data.batch_size": self.batch or batch,
                  "data.img_size": self.img_size or img_size}
        return [f"{key}={value}" for key, value in chosen.items() if value is not None]

    def to_argv(self) -> list[str]:
        """CLI flags reproducing these options (for worker processes), without the sub-benchmark names."""
        argv = [f"--num-classes={self.num_classes}", f"--iters={self.iters}", f"--warmup={self.warmup}",
                f"--seed={self.seed}", f"--images={self.images}", f"--workers={self.workers}",
                f"--kills={self.kills}", f"--step-ms={self.step_ms}"]
        for flag, value in (("--model", self.model), ("--batch", self.batch), ("--img-size", self.img_size),
                            ("--source-size", self.source_size)):
            if value is not None:
                argv.append(f"{flag}={value}")
        if self.variants:
            argv += ["--variants", *self.variants]  # last: it takes every value that follows
        return [*self.overrides, *argv]
