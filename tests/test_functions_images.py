"""GPU boot images: the default is a current Deep Learning VM family (docs/gcp-facts.md §12, the one record the
schema, the sim and these tests are held to); a job whose image does not exist is refused before any node exists;
an image the check could not see and the create then does not find fails the job once, without trying other zones.

Compute Engine is reached through the real google-cloud-compute client against sim/; the control plane through its
real entry points (functions_fixtures.controller)."""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timezone
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from functions_fixtures import ZONES, controller, gpu_spec, tpu_spec  # noqa: F401
from respawn.control import clients as factory
from respawn.control.adapters.compute import ComputeProvider
from respawn.control.adapters.tpu import TpuProvider
from respawn.control.actions import Act, Action
from respawn.control.decide import decide
from respawn.control.observation import ABSENT, Observation
from respawn.control.outcomes import Outcome, OutcomeKind, after_act
from respawn.images import ImageCheck, ImageVerdict, image_help
from respawn.schema import GpuAccelerator, SlotStatus, State, parse_spec
from sim import compute_global as sim_compute
from sim_fixtures import PROJECT, compute_clients, compute_result, sim_factory, sim_server  # noqa: F401
from tests.deploy_fixtures import check_against_cli, cli_tree

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "docs" / "gcp-facts.md"
DLVM = "deeplearning-platform-release"
DEFAULT = GpuAccelerator.model_fields["boot_image"].default
MISSING_FAMILY = f"projects/{DLVM}/global/images/family/pytorch-9-9-cu999-ubuntu-2204-nvidia-999"
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def facts_table() -> dict[str, str]:
    """§12's table: family → state (current, deprecated, retired), read from the page."""
    text = FACTS.read_text()
    m = re.search(r"^## 12\. .*?(?=^## |\Z)", text, re.M | re.S)
    assert m, f"{FACTS} has no section 12 (Deep Learning VM image families): the image facts live there"
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| [^|]+ \| (current|deprecated|retired)\b", m.group(0), re.M)
    assert rows, "§12 lists no families in its table (| `family` | OS, Python | state |)"
    return dict(rows)


def images_client(endpoint: str) -> compute_v1.ImagesClient:
    return compute_v1.ImagesClient(credentials=AnonymousCredentials(), transport="rest",
                                   client_options=ClientOptions(api_endpoint=endpoint))


# ------------------------------------------------------------------------------ one record: facts, schema, sim

def test_the_default_boot_image_is_a_current_family_in_the_facts_and_the_sim(sim_server):
    m = re.fullmatch(r"projects/([a-z0-9-]+)/global/images/family/([a-z0-9-]+)", DEFAULT)
    assert m, f"the default boot_image {DEFAULT!r} should name a family, so new image versions are picked up"
    project, family = m.groups()
    assert project == DLVM
    assert facts_table().get(family) == "current", (
        f"docs/gcp-facts.md §12 does not list {family} as current: update the table or the default")
    image = images_client(sim_server.endpoint).get_from_family(project=project, family=family)
    assert image.family == family and image.name.startswith(family + "-v") and "deprecated" not in image


def test_the_sims_image_table_is_the_facts_table():
    table = facts_table()
    documented = {f: ("ACTIVE" if state == "current" else "DEPRECATED") for f, state in table.items()
                  if state in ("current", "deprecated")}
    assert sim_compute.IMAGE_FAMILIES == documented, "sim/compute_global.py IMAGE_FAMILIES differs from docs/gcp-facts.md §12"
    assert any(state == "retired" for state in table.values())


def test_images_answer_like_compute_engine(sim_server):
    images = images_client(sim_server.endpoint)
    with pytest.raises(gexc.NotFound) as exc:
        images.get_from_family(project=DLVM, family="common-cu124-debian-11")  # the retired former default
    assert exc.value.message.endswith(f": The resource 'projects/{DLVM}/global/images/family/common-cu124-debian-11' was not found")
    assert [e["reason"] for e in exc.value.errors] == ["notFound"]
    # A deprecated family no longer resolves, while its image can still be named.
    with pytest.raises(gexc.NotFound):
        images.get_from_family(project=DLVM, family="common-cu128-ubuntu-2204-nvidia-570")
    old = images.get(project=DLVM, image=f"common-cu128-ubuntu-2204-nvidia-570-{sim_compute.SIM_IMAGE_VERSION}")
    assert old.deprecated.state == "DEPRECATED"
    with pytest.raises(gexc.NotFound):
        images.get(project=DLVM, image="common-cu129-ubuntu-2404-nvidia-580-v19990101")
    # Images of the job's own project exist once made.
    sim_server.compute.global_resources.add_image(PROJECT, "my-trainer-image", family="my-trainer")
    assert images.get_from_family(project=PROJECT, family="my-trainer").name == "my-trainer-image"


def test_an_insert_naming_a_missing_image_is_404_on_the_call_and_creates_nothing(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)

    def body(name, image):
        return compute_v1.Instance(
            name=name, machine_type="zones/us-central1-a/machineTypes/n1-standard-8",
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=image))])

    with pytest.raises(gexc.NotFound) as exc:
        instances.insert_unary(project=PROJECT, zone="us-central1-a", instance_resource=body("vm-1", MISSING_FAMILY))
    assert exc.value.message.endswith(f": The resource '{MISSING_FAMILY}' was not found")
    assert sim_server.status_of("us-central1-a", "vm-1") is None and sim_server.history() == []
    op = instances.insert_unary(project=PROJECT, zone="us-central1-a", instance_resource=body("vm-2", DEFAULT))
    compute_result(ops, PROJECT, "us-central1-a", op)
    assert sim_server.status_of("us-central1-a", "vm-2") == "RUNNING"


# ------------------------------------------------------------------------------ the provider's check

@pytest.fixture
def gpu(sim_server):
    return ComputeProvider(factory.Clients(factory.Endpoints(PROJECT, sim_server.endpoint, sim_server.endpoint)))


def _spec(image: str):
    return parse_spec(gpu_spec("img", accelerator={"kind": "gpu", "machine_type": "g2-standard-8", "boot_image": image}))


def test_the_check_finds_families_names_and_own_images_and_says_what_it_could_not_see(gpu, sim_server):
    found = gpu.check_image(_spec(DEFAULT))
    assert found.verdict is ImageVerdict.FOUND and found.image == DEFAULT
    assert found.detail == DEFAULT.rsplit("/", 1)[-1] + "-" + sim_compute.SIM_IMAGE_VERSION
    missing = gpu.check_image(_spec(MISSING_FAMILY))
    assert missing.verdict is ImageVerdict.MISSING and missing.detail == f"The resource '{MISSING_FAMILY}' was not found"
    deprecated_name = f"projects/{DLVM}/global/images/pytorch-2-7-cu128-ubuntu-2204-nvidia-570-{sim_compute.SIM_IMAGE_VERSION}"
    usable = gpu.check_image(_spec(deprecated_name))
    assert usable.verdict is ImageVerdict.FOUND and usable.detail.endswith("(DEPRECATED)")
    sim_server.compute.global_resources.add_image(PROJECT, "frozen", deprecated="OBSOLETE")
    obsolete = gpu.check_image(_spec("frozen"))  # a bare name: an image of the job's project
    assert obsolete.image == f"projects/{PROJECT}/global/images/frozen"
    assert obsolete.verdict is ImageVerdict.MISSING and "OBSOLETE" in obsolete.detail
    for status, kind in ((403, "Forbidden"), (503, "ServiceUnavailable")):
        sim_server.set_api_faults(count=1, status=status, methods=("image",))
        unchecked = gpu.check_image(_spec(DEFAULT))
        assert unchecked.verdict is ImageVerdict.UNCHECKED and unchecked.detail.startswith(kind), unchecked
    assert TpuProvider(gpu.clients).check_image(parse_spec(tpu_spec("t"))) is None


# ------------------------------------------------------------------------------ the decision (pure)

def _observation(image: ImageCheck | None, state: str = "PENDING") -> Observation:
    spec = _spec(DEFAULT)
    return Observation(job_id="img", spec=spec, spec_errors=(), status=SlotStatus(state=State(state)),
                       cancel_requested=False, node=ABSENT, heartbeat=None, now=NOW, image=image)


def test_decide_refuses_a_missing_image_only_on_the_first_handling():
    gone = ImageCheck(MISSING_FAMILY, ImageVerdict.MISSING, f"The resource '{MISSING_FAMILY}' was not found")
    d = decide(_observation(gone))
    assert d.action.kind is Act.NONE and d.status.state is State.INVALID and d.cause == "image_not_found"
    assert MISSING_FAMILY in d.status.message and d.alert["type"] == "invalid_spec"
    assert d.alert["errors"] == [d.status.message.removeprefix("invalid job spec: ")]
    for image in (None, ImageCheck(DEFAULT, ImageVerdict.FOUND, "x"), ImageCheck(DEFAULT, ImageVerdict.UNCHECKED, "403")):
        assert decide(_observation(image)).action.kind is Act.CREATE
    # After the first placement the image is not the question any more (observe() does not even ask).
    assert decide(_observation(gone, "WAITING_FOR_CAPACITY")).status.state is State.PROVISIONING


def test_a_create_404_naming_an_image_fails_the_job_with_how_to_find_one():
    s = SlotStatus(state=State.PROVISIONING, attempt=1, node="img-1", zone=ZONES[0], create_state="pending")
    a = Action(Act.CREATE, zone=ZONES[0], node="img-1", attempt=1, provisioning="spot")
    image_404 = Outcome(OutcomeKind.NOT_FOUND, "notFound", f"The resource '{MISSING_FAMILY}' was not found")
    d = after_act("img", s, a, image_404, NOW)
    assert d.status.state is State.FAILED and d.cause == "create_failed"
    assert MISSING_FAMILY in d.status.message and "gcloud compute images list" in d.status.message
    assert len(d.status.message) < 1000, "the hint must survive after_create_failed's cut at 1000 characters"
    other_404 = Outcome(OutcomeKind.NOT_FOUND, "notFound", "The resource 'projects/p/global/networks/x' was not found")
    assert "gcloud" not in after_act("img", s, a, other_404, NOW).status.message


def test_the_help_names_commands_the_google_cloud_cli_accepts():
    tree = cli_tree()
    for image in (MISSING_FAMILY, f"projects/{DLVM}/global/images/common-cu129-ubuntu-2404-nvidia-580-v19990101"):
        text = image_help(image)
        commands = re.findall(r"`(gcloud [^`]+)`", text)
        assert len(commands) == 2, text
        for command in commands:
            # gcloud accepts --no-FLAG for a boolean --FLAG; the static tree lists only --FLAG.
            argv = [re.sub(r"^--no-", "--", a) if a.startswith("--no-") else a for a in shlex.split(command)[1:]]
            assert check_against_cli(argv, tree) == [], command
        assert f"--project={DLVM}" in text and DEFAULT in text


# ------------------------------------------------------------------------------ through the entry points

def test_a_job_whose_family_does_not_exist_is_invalid_and_no_node_is_made(controller):
    job = controller.register(gpu_spec("noimage", accelerator={"kind": "gpu", "machine_type": "g2-standard-8",
                                                               "boot_image": MISSING_FAMILY}))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "INVALID")
    assert st.message.startswith(f"invalid job spec: accelerator.boot_image: {MISSING_FAMILY} cannot boot a VM: "
                                 f"The resource '{MISSING_FAMILY}' was not found. ")
    assert f"gcloud compute images list --project={DLVM}" in st.message
    assert st.attempt == 0 and st.node is None
    assert controller.sim.history() == []
    events = [(e["from_state"], e["to_state"], e["cause"]) for e in controller.events(job)]
    assert events == [("PENDING", "INVALID", "image_not_found")]
    [alert] = controller.alerts(want=1)
    assert alert["type"] == "invalid_spec" and alert["cause"] == "image_not_found" and MISSING_FAMILY in alert["errors"][0]
    assert controller.sweep() == 200  # a terminal job stays as it is
    assert controller.status(job).state is State.INVALID and controller.sim.history() == []


def test_jobs_with_existing_images_provision_as_before(controller):
    controller.sim.compute.global_resources.add_image(controller.project, "team-image-v3", family="team-image")
    for job_id, image in (("pytorch", f"projects/{DLVM}/global/images/family/pytorch-2-9-cu129-ubuntu-2204-nvidia-580"),
                          ("custom", "team-image-v3")):
        job = controller.register(gpu_spec(job_id, accelerator={"kind": "gpu", "machine_type": "g2-standard-8",
                                                                "boot_image": image}))
        assert controller.job_created(job) == 200
        st = controller.wait_state(job, "RUNNING")
        assert (st.attempt, st.zone) == (1, ZONES[0])
    tpu = controller.register(tpu_spec("tpu"))  # no image to check
    assert controller.job_created(tpu) == 200
    controller.wait_state(tpu, "RUNNING")


def test_an_unchecked_image_that_the_create_does_not_find_fails_the_job_once(controller):
    # The check is refused (no permission on the image's project): it blocks nothing, and the create tells.
    controller.sim.set_api_faults(count=1, status=403, methods=("image",))
    job = controller.register(gpu_spec("late404", accelerator={"kind": "gpu", "machine_type": "g2-standard-8",
                                                               "boot_image": MISSING_FAMILY}))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "FAILED")
    assert st.message.startswith(f"creating late404-1 in {ZONES[0]} failed: notFound: "
                                 f"The resource '{MISSING_FAMILY}' was not found. ")
    assert st.message.endswith("register the job under a new id"), "the help was cut: " + st.message
    assert (st.attempt, st.zone, st.tried_zones) == (1, ZONES[0], [])
    assert controller.capacity() == {} and controller.sim.history() == []
    events = [(e["from_state"], e["to_state"], e["cause"]) for e in controller.events(job)]
    assert events == [("PENDING", "PROVISIONING", "job_created"), ("PROVISIONING", "FAILED", "create_failed")]
    assert controller.sweep() == 200
    assert controller.status(job).attempt == 1 and controller.sim.history() == []


def test_an_image_check_that_fails_transiently_does_not_hold_the_job(controller):
    controller.sim.set_api_faults(count=1, status=503, methods=("image",))
    job = controller.register(gpu_spec("flaky"))
    assert controller.job_created(job) == 200
    assert controller.wait_state(job, "RUNNING").attempt == 1


# ------------------------------------------------------------------------------ IAM

def test_the_controller_is_granted_the_image_reads_it_makes():
    from deploy import iam
    from tests.test_deploy_iam import called_by_controller

    needed = {"compute.images.get", "compute.images.getFromFamily"}
    assert needed <= called_by_controller(), "the adapters' scan does not see ComputeProvider.check_image's calls"
    granted = {m: p for role in iam.roles() if role.member == "controller" and role.scope == "project"
               for m, p in role.methods.items()}
    assert granted["compute.images.getFromFamily"] == ("compute.images.getFromFamily",)
    assert granted["compute.images.get"] == ("compute.images.get",)
