// Modal dialogs on the native <dialog> element: showModal() gives focus
// trapping, Escape to cancel and an inert page behind, which a hand-made
// overlay would have to imitate.
import type { ComponentChildren } from 'preact'
import { useEffect, useRef } from 'preact/hooks'

export interface DialogProps {
  title: string
  /** The primary button's text ("Remove", "Branch"...). */
  confirm: string
  danger?: boolean
  busy?: boolean
  /** The secondary button's text (default "Cancel"). */
  cancel?: string
  /** Wide, for lists (Changes…, Merge…). */
  wide?: boolean
  error?: string | null
  onConfirm: () => void
  onClose: () => void
  children?: ComponentChildren
}

export function Dialog(props: DialogProps) {
  const ref = useRef<HTMLDialogElement>(null)
  useEffect(() => {
    const d = ref.current!
    if (!d.open) d.showModal()
    const cancel = (e: Event) => {
      e.preventDefault()
      props.onClose()
    }
    d.addEventListener('cancel', cancel)
    return () => d.removeEventListener('cancel', cancel)
  }, [props.onClose])
  return (
    <dialog ref={ref} class={props.wide ? 'dialog wide' : 'dialog'} aria-labelledby="dialog-title">
      <form
        method="dialog"
        onSubmit={(e) => {
          e.preventDefault()
          if (!props.busy) props.onConfirm()
        }}
      >
        <h2 id="dialog-title">{props.title}</h2>
        <div class="dialog-body">{props.children}</div>
        {props.error && (
          <p class="error" role="alert">
            {props.error}
          </p>
        )}
        <div class="dialog-buttons">
          <button type="button" onClick={props.onClose} disabled={props.busy}>
            {props.cancel ?? 'Cancel'}
          </button>
          <button type="submit" class={props.danger ? 'danger' : 'primary'} disabled={props.busy}>
            {props.busy ? `${props.confirm}…` : props.confirm}
          </button>
        </div>
      </form>
    </dialog>
  )
}
