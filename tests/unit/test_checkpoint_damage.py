"""push.checkpoint_damage: which query failures are an unreadable file of the job's own checkpoint."""

from deltabus.push.checkpoint_damage import damage, set_aside

CKPT = "/w/_checkpoints/deliver"
SEEN = ("[STREAM_FAILED] Query [id = 5f, runId = 9a] terminated with exception: "
        "Failed to read log file /w/_checkpoints/deliver/offsets/27. Incomplete log file")


def test_an_unreadable_log_file_of_this_checkpoint_is_damage_with_its_line():
    assert damage(SEEN, CKPT) == SEEN
    assert damage("java.io.EOFException at /w/_checkpoints/deliver/commits/3 ...", CKPT) is not None
    assert damage(SEEN, "file:///w/_checkpoints/deliver") == SEEN  # a file: URI names the same path
    halved = ("terminated with exception: Checksum error: file:/w/_checkpoints/deliver/commits/28 at 0 exp: -2153 got: -6530 "
              "SQLSTATE: XXKST")
    assert damage(halved, CKPT) == halved


def test_other_failures_and_other_checkpoints_are_not():
    assert damage("Connection reset SQLSTATE: XXKST", CKPT) is None
    assert damage(SEEN.replace("/w/", "/other/"), CKPT) is None
    assert damage("terminated with exception: disk quota exceeded writing /w/_checkpoints/deliver/offsets/3", CKPT) is None
    # Another engine's checkpoint beside it, and a sign on another line than the path: not this damage.
    assert damage(SEEN.replace("/deliver/", "/deliver-delta-spark/"), CKPT) is None
    assert damage("java.io.EOFException\n while writing /w/_checkpoints/deliver/offsets/3", CKPT) is None


def test_set_aside_renames_a_local_checkpoint_and_leaves_a_remote_one(tmp_path):
    ckpt = tmp_path / "deliver"
    (ckpt / "offsets").mkdir(parents=True)
    moved = set_aside(str(ckpt), "20261126T000000Z")
    assert moved == f"{ckpt}.damaged-20261126T000000Z" and not ckpt.exists() and (tmp_path / "deliver.damaged-20261126T000000Z" / "offsets").is_dir()
    assert set_aside("s3://bucket/_checkpoints/deliver", "x") is None
    ckpt.mkdir()  # damaged again within the same second: a name of its own
    assert set_aside(str(ckpt), "20261126T000000Z") == f"{ckpt}.damaged-20261126T000000Z-2"
