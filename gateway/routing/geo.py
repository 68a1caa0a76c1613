"""Distances, a network latency model, and where a client is."""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Mapping

log = logging.getLogger(__name__)

EARTH_RADIUS_KM = 6371.0

# Latency model: a fixed cost (TLS/TCP handling, last mile) plus a round trip over fibre.
BASE_MS = 2.0
FIBRE_KM_PER_MS = 200.0  # light in glass travels at ~2/3 c ≈ 200,000 km/s
ROUTE_INFLATION = 1.5  # cables follow coasts and hubs, not great circles


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Haversine distance between two points given in degrees."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))


def latency_ms(km: float) -> float:
    """Estimated request round-trip time to a node km away along the great circle."""
    return BASE_MS + 2 * km * ROUTE_INFLATION / FIBRE_KM_PER_MS


# Capital-city coordinates: a stable, checkable stand-in for "where a country's clients are".
COUNTRY_CENTROIDS: dict[str, tuple[float, float]] = {
    "US": (38.91, -77.04), "CA": (45.42, -75.70), "MX": (19.43, -99.13),
    "BR": (-15.79, -47.88), "AR": (-34.60, -58.38), "CL": (-33.45, -70.67),
    "CO": (4.71, -74.07), "PE": (-12.05, -77.04),
    "GB": (51.51, -0.13), "IE": (53.35, -6.26), "FR": (48.86, 2.35), "DE": (52.52, 13.40),
    "NL": (52.37, 4.90), "BE": (50.85, 4.35), "CH": (46.95, 7.45), "AT": (48.21, 16.37),
    "IT": (41.90, 12.50), "ES": (40.42, -3.70), "PT": (38.72, -9.14), "SE": (59.33, 18.07),
    "NO": (59.91, 10.75), "DK": (55.68, 12.57), "FI": (60.17, 24.94), "PL": (52.23, 21.01),
    "CZ": (50.08, 14.44), "UA": (50.45, 30.52), "RU": (55.76, 37.62), "TR": (39.93, 32.86),
    "IL": (31.77, 35.21), "AE": (24.45, 54.38), "SA": (24.71, 46.68), "EG": (30.04, 31.24),
    "NG": (9.08, 7.40), "KE": (-1.29, 36.82), "ZA": (-25.75, 28.23),
    "IN": (28.61, 77.21), "PK": (33.68, 73.05), "CN": (39.90, 116.41), "JP": (35.68, 139.65),
    "KR": (37.57, 126.98), "TW": (25.03, 121.57), "HK": (22.32, 114.17), "SG": (1.35, 103.82),
    "MY": (3.14, 101.69), "TH": (13.76, 100.50), "VN": (21.03, 105.83), "ID": (-6.21, 106.85),
    "PH": (14.60, 120.98), "AU": (-35.28, 149.13), "NZ": (-41.29, 174.78),
}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ClientLocator:
    """Where a request comes from, best source first.

    1. `x-client-geo: "lat,lon"` (a malformed value is ignored, never an error: it is a hint);
    2. `cf-ipcountry: "DE"`, as Cloudflare's edge sets it (unknown codes such as XX are ignored);
    3. the client IP in `ip_map`, an IP or CIDR prefix -> city code (longest prefix wins).
    """

    def __init__(self, ip_map: dict[str, str] | None,
                 cities: dict[str, tuple[float, float]]) -> None:
        self._networks: list[tuple[Network, tuple[float, float]]] = []
        for prefix, city in (ip_map or {}).items():
            if city not in cities:
                raise ValueError(f"ip map sends {prefix} to unknown city {city!r}")
            self._networks.append((ipaddress.ip_network(prefix, strict=False), cities[city]))
        self._networks.sort(key=lambda entry: entry[0].prefixlen, reverse=True)

    def locate(self, headers: Mapping[str, str],
               client_ip: str | None) -> tuple[float, float] | None:
        lowered = {k.lower(): v for k, v in headers.items()}
        geo = _parse_geo(lowered.get("x-client-geo"))
        if geo is not None:
            return geo
        country = lowered.get("cf-ipcountry", "").strip().upper()
        if country in COUNTRY_CENTROIDS:
            return COUNTRY_CENTROIDS[country]
        return self._by_ip(client_ip)

    def _by_ip(self, client_ip: str | None) -> tuple[float, float] | None:
        if not client_ip or not self._networks:
            return None
        try:
            address = ipaddress.ip_address(client_ip)
        except ValueError:
            return None
        for network, location in self._networks:
            if address.version == network.version and address in network:
                return location
        return None


def _parse_geo(value: str | None) -> tuple[float, float] | None:
    if value is None:
        return None
    try:
        lat, lon = (float(part) for part in value.split(","))
    except ValueError:
        log.debug("ignoring malformed x-client-geo %r", value)
        return None
    if not (math.isfinite(lat) and math.isfinite(lon) and -90 <= lat <= 90
            and -180 <= lon <= 180):
        log.debug("ignoring out-of-range x-client-geo %r", value)
        return None
    return lat, lon
