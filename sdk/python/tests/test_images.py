"""Images against a real daemon: list, get and delete; importing a root
filesystem tarball (a file, streamed) and an OCI image layout (a directory,
packed by the SDK), then spawning sandboxes of them and running commands
with the image's defaults.

The images are made here from the host's statically linked busybox: a tar
with ``bin/busybox`` and ``bin/sh`` linked to it is a complete image.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import secrets
import shutil
import tarfile
from pathlib import Path
from typing import Iterator, List

import pytest

import forkvm
from forkvm import Client, Sandbox, models

BUSYBOX = Path("/bin/busybox")

pytestmark = pytest.mark.skipif(not BUSYBOX.is_file(), reason="needs a statically linked /bin/busybox")


def rootfs_tar_bytes() -> bytes:
    """A root filesystem: /bin/busybox and /bin/sh -> busybox."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        bin_dir = tarfile.TarInfo("bin")
        bin_dir.type, bin_dir.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(bin_dir)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        sh = tarfile.TarInfo("bin/sh")
        sh.type, sh.linkname, sh.mode = tarfile.SYMTYPE, "busybox", 0o777
        tar.addfile(sh)
    return out.getvalue()


def write_oci_layout(directory: Path, config: dict) -> None:
    """An OCI image layout of one gzip'd busybox layer, with ``config`` as its image config."""

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (directory / "blobs" / "sha256" / digest).write_bytes(data)
        return f"sha256:{digest}"

    (directory / "blobs" / "sha256").mkdir(parents=True)
    layer = rootfs_tar_bytes()
    layer_gz = gzip.compress(layer)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    config_bytes = json.dumps(image_config).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": blob(config_bytes),
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": blob(layer_gz),
                    "size": len(layer_gz),
                }
            ],
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": blob(manifest),
                "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    (directory / "index.json").write_text(json.dumps(index))
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


@pytest.fixture
def image_name(client: Client) -> Iterator[str]:
    """A unique image name; the image is removed afterwards if the test left it."""
    name = f"pytest-img-{secrets.token_hex(4)}"
    yield name
    try:
        image = client.get_image(name)
    except forkvm.NotFound:
        return
    for sb in image.sandboxes or []:
        try:
            client.delete_sandbox(sb)
        except forkvm.NotFound:
            pass
    client.delete_image(name)


def test_list_and_get_the_builtin_image(client: Client) -> None:
    images = {i.name: i for i in client.list_images().images}
    assert "default" in images
    default = client.get_image("default")
    assert default.format == "ext4" and default.size_bytes > 0 and default.source
    assert isinstance(default.config, models.ImageConfig)


def test_unknown_images(client: Client) -> None:
    with pytest.raises(forkvm.NotFound) as got:
        client.get_image("pytest-no-such-image")
    assert got.value.status == 404
    with pytest.raises(forkvm.NotFound):
        client.delete_image("pytest-no-such-image")


@pytest.mark.slow
def test_import_a_rootfs_tarball_spawn_exec_and_delete(client: Client, image_name: str, tmp_path: Path) -> None:
    archive = tmp_path / "busybox-rootfs.tar"
    archive.write_bytes(rootfs_tar_bytes())
    events: List[models.ImageEvent] = []
    image = client.import_image(archive, image_name, on_event=events.append)
    assert image.name == image_name and image.source == "import" and image.format == "ext4"
    assert events and events[-1].type == "done" and events[-1].image.name == image_name
    assert image_name in {i.name for i in client.list_images().images}
    assert client.get_image(image_name).size_bytes == image.size_bytes

    # A second import under the name is refused before the upload, unless it replaces.
    with pytest.raises(forkvm.Conflict) as got:
        client.import_image(archive, image_name)
    assert got.value.status == 409

    with Sandbox(image_name, client=client) as sb:
        assert sb.info.image == image_name
        result = sb.exec(["/bin/busybox", "echo", "hi"])
        assert (result.exit_code, result.stdout) == (0, "hi\n")
        assert sb.id in (client.get_image(image_name).sandboxes or [])
        with pytest.raises(forkvm.Conflict, match=sb.id) as got:
            client.delete_image(image_name)
        assert got.value.status == 409
    client.delete_image(image_name)
    with pytest.raises(forkvm.NotFound):
        client.get_image(image_name)
    assert image_name not in {i.name for i in client.list_images().images}


@pytest.mark.slow
def test_import_an_oci_layout_directory_with_its_defaults(client: Client, image_name: str, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_oci_layout(
        layout,
        {
            "Cmd": ["/bin/busybox", "echo", "from-cmd"],
            "Env": ["PATH=/bin", "GREETING=hello"],
            "WorkingDir": "/bin",
        },
    )
    phases: List[str] = []
    image = client.import_image(layout, image_name, on_event=lambda e: phases.append(e.type))
    assert phases[-1] == "done"
    assert image.config.cmd == ["/bin/busybox", "echo", "from-cmd"]
    assert "GREETING=hello" in (image.config.env or [])
    assert image.config.working_dir == "/bin"
    assert image.layers and len(image.layers) == 1

    sb = Sandbox(image_name, client=client)
    try:
        # No argv: the image's Entrypoint and Cmd.
        assert sb.exec([]).stdout == "from-cmd\n"
        # The image's Env and WorkingDir apply to every exec; env adds to them.
        out = sb.exec(["/bin/busybox", "sh", "-c", "echo $GREETING $EXTRA; pwd"], env={"EXTRA": "x"})
        assert out.stdout == "hello x\n/bin\n"
        assert sb.exec(["/bin/busybox", "id", "-u"], user="1000").stdout.strip() == "1000"
        assert sb.exec(["/bin/busybox", "id", "-u"]).stdout.strip() == "0"
    finally:
        sb.close()
    client.delete_image(image_name)


def test_the_busybox_fixture_is_a_real_tar(tmp_path: Path) -> None:
    """The helpers themselves (so a failure above is the daemon's, not theirs)."""
    with tarfile.open(fileobj=io.BytesIO(rootfs_tar_bytes())) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert names["bin/sh"].issym() and names["bin/sh"].linkname == "busybox"
    assert names["bin/busybox"].size == BUSYBOX.stat().st_size
    write_oci_layout(tmp_path / "l", {"Cmd": ["x"]})
    index = json.loads((tmp_path / "l" / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((tmp_path / "l" / "blobs" / "sha256" / digest).read_bytes())
    assert len(manifest["layers"]) == 1
    shutil.rmtree(tmp_path / "l")
