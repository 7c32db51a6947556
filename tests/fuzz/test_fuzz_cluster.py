"""Properties of ClusterState (the path both sources feed) and of every in-tree backend's render,
for any mix of valid, nearly valid and hostile Services, EndpointSlices and Nodes."""

from __future__ import annotations

from fuzz_checks import (
    FAMILIES,
    Rejections,
    missing_services,
    programmed_anyway,
    render_all,
    unnamed_rejections,
    unsafe_lines,
)
from hypothesis import event, given
from kube_strategies import NODE, Mix, mixes

from kubeplex.core.model.cluster import ClusterState


def feed(cluster: ClusterState, mix: Mix) -> None:
    for obj in mix.order:
        kind = obj.get("kind")
        if kind == "Service":
            cluster.set_service(obj)
        elif kind == "EndpointSlice":
            cluster.set_endpoint_slice(obj)
        else:
            cluster.set_node(obj)


@given(mixes())
def test_any_mix_is_rendered_safely_by_every_mode(mix: Mix) -> None:
    """Feeding any mix and rendering it with every mode never raises (1); every good Service is
    programmed (2), ExternalName and headless ones are not; no input string reaches a rule
    unescaped (3); every rejection names the object and the field (4). One property, so each
    example is rendered once."""
    sink = Rejections()
    cluster = ClusterState(NODE, FAMILIES, on_invalid=sink)
    feed(cluster, mix)
    rejected = {id(obj) for _, obj in sink.seen}
    for b in mix.broken:  # what the examples covered (--hypothesis-show-statistics)
        kind = "hostile" if b.hostile else "nearly valid"
        event(f"{kind} {b.obj.get('kind')}: {'rejected' if id(b.obj) in rejected else 'accepted'}")
    rendered = render_all(cluster)
    assert missing_services(rendered, mix.good) == []
    assert programmed_anyway(rendered, mix.unprogrammed) == []
    assert unsafe_lines(rendered) == []
    assert unnamed_rejections(sink.seen, mix.broken) == []
