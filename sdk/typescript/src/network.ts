/**
 * Network options of the high-level API: how `Sandbox.create`,
 * `Snapshot.spawn` and `Sandbox.branch` take ports and egress rules.
 *
 * @module
 */
import type * as api from "./types.js";

/**
 * A guest TCP port to publish on a host loopback port: a guest port (the
 * host port is allocated: see `Sandbox.ports()`), or `{ guest, host }`
 * (`host` 0 or omitted: allocated).
 */
export type PortSpec = number | api.PortForward;

/**
 * An egress allow-list entry: an IPv4 address or network as a string
 * (`"10.0.0.0/8"`: every port), or `{ cidr, ports }`.
 */
export type EgressSpec = string | api.EgressRule;

/** The network of a new sandbox (every field is optional). */
export interface NetworkOptions {
  /** `nat` (the default where the host allows it): a network of its own with NAT egress; `none`: no way out. */
  network?: api.NetworkMode | undefined;
  /** Guest TCP ports to publish on host loopback ports, e.g. `[8000]` or `[{ guest: 8000, host: 18000 }]` (needs `nat`). */
  ports?: PortSpec[] | undefined;
  /**
   * Allow egress only to these destinations, e.g. `["10.0.0.0/8", { cidr: "1.2.3.4", ports: [443] }]`
   * (needs `nat`). Omitted: any destination except the host and other sandboxes. The list
   * holds for the guest and for every process in the sandbox's namespace.
   */
  egress?: EgressSpec[] | undefined;
  /** `true`: let the `egress` entries reach the host itself too (needs `egress`; default false). */
  allowHost?: boolean | undefined;
  /** `false`: return before the guest's network is proven to work (default true). */
  waitForNetwork?: boolean | undefined;
}

/** One {@link PortSpec} as a wire {@link api.PortForward}. */
export function portForward(spec: PortSpec): api.PortForward {
  if (typeof spec === "number") return { guest: spec };
  if (spec !== null && typeof spec === "object") return spec;
  throw new TypeError(`a port is a guest port number or { guest, host }, not ${JSON.stringify(spec)}`);
}

/** One {@link EgressSpec} as a wire {@link api.EgressRule}. */
export function egressRule(spec: EgressSpec): api.EgressRule {
  if (typeof spec === "string") return { cidr: spec };
  if (spec !== null && typeof spec === "object") return spec;
  throw new TypeError(`an egress rule is a CIDR string or { cidr, ports }, not ${JSON.stringify(spec)}`);
}

function list<T>(name: string, value: readonly T[], example: string): readonly T[] {
  if (!Array.isArray(value)) throw new TypeError(`${name} must be an array, e.g. ${name}: [${example}]`);
  return value;
}

/** The request fields of {@link NetworkOptions}, leaving out what is not set. */
export function networkFields(
  opts: NetworkOptions,
): Pick<api.CreateSandbox, "network" | "ports" | "egress" | "allow_host" | "wait_for_network"> {
  const req: Pick<api.CreateSandbox, "network" | "ports" | "egress" | "allow_host" | "wait_for_network"> = {};
  if (opts.network !== undefined) req.network = opts.network;
  if (opts.ports !== undefined) req.ports = list("ports", opts.ports, "8000").map(portForward);
  if (opts.egress !== undefined) req.egress = list("egress", opts.egress, '"10.0.0.0/8"').map(egressRule);
  if (opts.allowHost !== undefined) req.allow_host = opts.allowHost;
  if (opts.waitForNetwork !== undefined) req.wait_for_network = opts.waitForNetwork;
  return req;
}
