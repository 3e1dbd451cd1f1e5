//! The CLI's wording of the daemon's error hints. The daemon names what to
//! do next as an action (`forkvm_api::types::HintAction`); each client says
//! it its own way, and this is the CLI's: the command to run.

use forkvm_api::types::{ErrorHint, HintAction};
use forkvm_api::ClientError;

/// The command that carries out `hint`, when the CLI has one.
pub fn command(hint: &ErrorHint) -> String {
    let t = hint.target.as_deref().unwrap_or("ID");
    match hint.action {
        HintAction::ListSandboxes => "forkvm ps".into(),
        HintAction::ListSnapshots => "forkvm snapshot ls".into(),
        HintAction::ListImages => "forkvm image ls".into(),
        HintAction::ListProcesses => format!("forkvm proc ls {t}"),
        HintAction::RemoveSandbox => format!("forkvm rm {t}"),
        HintAction::RemoveSandboxes => "forkvm ps, then forkvm rm ID".into(),
        HintAction::ResumeSandbox => format!("forkvm resume {t}"),
        HintAction::ReadLogs => format!("forkvm logs {t}"),
        HintAction::FreeSpace => "forkvm snapshot prune (or forkvm image rm, forkvm rm)".into(),
        HintAction::RemoveSnapshot => format!("forkvm snapshot rm {t}"),
        HintAction::ForceRemoveSnapshot => format!("forkvm snapshot rm --force {t}"),
        HintAction::FlattenSnapshot => format!("forkvm snapshot flatten {t}"),
        HintAction::PushSnapshot => "forkvm snapshot push".into(),
        HintAction::CheckHost => "forkvm doctor".into(),
        HintAction::CreateVolume => format!("forkvm volume create {t}"),
        HintAction::RemoveVolume => format!("forkvm volume rm {t}"),
        HintAction::GetImage => "forkvm image pull, import or build (forkvm image --help)".into(),
        HintAction::RemoveImage => format!("forkvm image rm {t}, or --replace"),
        HintAction::ImportImage => "forkvm image import".into(),
    }
}

/// The line the CLI adds under an error that carries a hint.
pub fn line(e: &anyhow::Error) -> Option<String> {
    let hint = e
        .chain()
        .find_map(|c| match c.downcast_ref::<ClientError>() {
            Some(ClientError::Api { hint: Some(h), .. }) => Some(h),
            _ => None,
        })?;
    Some(format!("forkvm: try `{}`", command(hint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_becomes_the_command_with_its_target() {
        let h = ErrorHint {
            action: HintAction::RemoveSandbox,
            target: Some("sb-1".into()),
        };
        assert_eq!(command(&h), "forkvm rm sb-1");
        let e = anyhow::Error::new(ClientError::Api {
            status: 409,
            code: "conflict".into(),
            message: "sandbox sb-1 has failed; remove sandbox sb-1".into(),
            hint: Some(h),
        })
        .context("exec in sb-1");
        assert_eq!(line(&e).unwrap(), "forkvm: try `forkvm rm sb-1`");
        assert!(line(&anyhow::anyhow!("plain")).is_none());
    }
}
