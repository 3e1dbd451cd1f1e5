/**
 * The hint of an error: what to do next, named as an action on the API
 * (re-exported by `types.ts`; `ErrorDetail.hint` carries one).
 *
 * @module
 */

/** A next step named as an action on the API, not as one client's command. */
export interface ErrorHint {
  action: HintAction;
  /** The sandbox, snapshot, image or volume the action applies to. */
  target?: string;
}

/** The actions an error can point to. */
export type HintAction =
  | "list_sandboxes"
  | "list_snapshots"
  | "list_images"
  | "list_processes"
  | "remove_sandbox"
  | "remove_sandboxes"
  | "resume_sandbox"
  | "read_logs"
  | "free_space"
  | "remove_snapshot"
  | "force_remove_snapshot"
  | "flatten_snapshot"
  | "push_snapshot"
  | "check_host"
  | "create_volume"
  | "remove_volume"
  | "get_image"
  | "remove_image"
  | "import_image";
