"""The CLI's look at a GPU job's boot image before `respawn jobs register` writes the job (respawn.images says
what the answer means). One Compute Engine REST GET — images.getFromFamily for projects/P/global/images/family/F,
images.get for projects/P/global/images/NAME — through respawn.app.compute_read.
"""

from __future__ import annotations

from respawn.images import IMAGE_PATH, ImageCheck, ImageVerdict, found, image_path

from .compute_read import Reader, reader


def check(boot_image: str, project: str | None) -> ImageCheck | None:
    """What Compute Engine says of the image; None where there is nothing to ask (a local run without the sim)."""
    look = reader(project)
    if look is None:
        return None
    if not isinstance(look, Reader):
        return ImageCheck(boot_image, ImageVerdict.UNCHECKED, look)
    path = image_path(boot_image, look.project or "")
    m = IMAGE_PATH.match(path)
    if m is None or not m["project"]:
        return ImageCheck(path, ImageVerdict.UNCHECKED, "no project to look for the image in (--project)")
    what = f"family/{m['family']}" if m["family"] else m["name"]
    answer = look.get(f"projects/{m['project']}/global/images/{what}")
    if answer.status is None:
        return ImageCheck(path, ImageVerdict.UNCHECKED, answer.problem)
    if answer.status != 200:
        if answer.status == 404:
            return ImageCheck(path, ImageVerdict.MISSING, answer.message or "not found")
        return ImageCheck(path, ImageVerdict.UNCHECKED,
                          f"HTTP {answer.status}" + (f": {answer.message}" if answer.message else ""))
    body = answer.body
    return found(path, str(body.get("name", "")), str((body.get("deprecated") or {}).get("state", "")))
