"""Page files decoded ahead (`runtime.prefetch_pages`): while a pass runs on the device, threads decode the next
pass's page files (open, upright, load: the host part of preprocessing), so that pass prepares from decoded images."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from PIL import Image

#: Decodes one input file: its image, or None for an input that is no image (nothing decoded ahead).
Decode = Callable[[Path], Image.Image | None]


def close_images(images: Iterable[Image.Image | None]) -> None:
    """Close each decoded image (closing one already closed does nothing)."""
    for image in images:
        if image is not None:
            image.close()


class PagePrefetch:
    """The page files of one coming pass, each decoded on a pool of its own threads; :meth:`take` or :meth:`discard`
    returns once the pool's threads have finished."""

    def __init__(self, paths: Sequence[Path], decode: Decode, workers: int) -> None:
        self.paths = tuple(paths)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="llo-prefetch")
        self._futures: list[Future[Image.Image | None]] = [self._pool.submit(decode, path) for path in self.paths]

    def is_for(self, paths: Sequence[Path]) -> bool:
        """Whether this prefetch decodes exactly `paths`, in that order."""
        return self.paths == tuple(paths)

    def take(self) -> list[Image.Image | None]:
        """Each page's decoded image (closed by the caller) once all are; a decoding error is raised here."""
        try:
            return [future.result() for future in self._futures]
        except BaseException:
            self.discard()
            raise
        finally:
            self._pool.shutdown(wait=True)

    def discard(self) -> None:
        """Cancel the decodes not started, wait for the running ones and close every image decoded."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        close_images(f.result() for f in self._futures if not f.cancelled() and f.exception() is None)
