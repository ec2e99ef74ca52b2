//! Which quantized kernel runs ([`Isa`]): the best the CPU has, chosen once per process and
//! checked at start-up against the portable kernel on a small matrix of both formats; a
//! kernel that disagrees is skipped with a warning (the next best is tried), so a kernel bug
//! or a CPU erratum costs speed, never wrong answers.
//!
//! Invariant: [`Isa::selected`] only ever returns a kernel the CPU has and that passed the
//! check; `--cpu-kernels` ([`select`]) can lower the choice, never raise it above the CPU.

use std::sync::OnceLock;

use super::act::QuantRows;
use super::blocks::{Q4Block, Q8Block};
use super::{QFormat, QK, QuantMatrix};

/// A quantized kernel family, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AMX int8 tiles for batches (`tdpbssd`/`tdpbsud`, 16 rows × 16 outputs × one block per
    /// instruction), AVX-512 VNNI for one row and small batches.
    Amx,
    /// AVX-512 F/BW + VNNI: `vpdpbusd` on two panels per 512-bit vector.
    Avx512Vnni,
    /// AVX-VNNI (VEX-encoded `vpdpbusd`, 256-bit), one panel per vector.
    AvxVnni,
    /// AVX2 + FMA + F16C: `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// Plain Rust, any CPU: the reference the others are checked against.
    Portable,
}

/// Every kernel family, best first.
pub const ALL: [Isa; 5] = [
    Isa::Amx,
    Isa::Avx512Vnni,
    Isa::AvxVnni,
    Isa::Avx2,
    Isa::Portable,
];

static SELECTED: OnceLock<Isa> = OnceLock::new();
static CAP: OnceLock<Isa> = OnceLock::new();

/// A kernel that disagreed with the portable one at start-up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{isa} kernel disagrees with the portable one: {fmt:?} {m}x{n}x{k} output {at}: {got} vs {want}"
)]
pub struct SelfCheckError {
    pub isa: Isa,
    pub fmt: QFormat,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub at: usize,
    pub got: f32,
    pub want: f32,
}

impl Isa {
    /// The name the start-up log, `/v1/models` and `--cpu-kernels` use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// Every family's name, best first, comma-separated (for help and errors).
    pub fn all_names() -> String {
        ALL.map(Isa::name).join(", ")
    }

    /// The family named `name` ([`Isa::name`]).
    pub fn from_name(name: &str) -> Option<Isa> {
        ALL.into_iter().find(|i| i.name() == name)
    }

    /// Whether this CPU has every feature the kernel uses.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Isa::Amx => Isa::Avx512Vnni.available() && super::amx::usable(),
                Isa::Avx512Vnni => {
                    avx2 && has!("avx512f")
                        && has!("avx512bw")
                        && has!("avx512vl")
                        && has!("avx512vnni")
                }
                Isa::AvxVnni => avx2 && has!("avxvnni"),
                Isa::Avx2 => avx2,
                Isa::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The one-panel kernel of this family (AMX's and AVX-512 VNNI's is the latter's 256-bit form, in the VEX
    /// encoding where the CPU has AVX-VNNI too).
    pub(super) fn one_panel(self) -> Panel {
        match self {
            Isa::Amx | Isa::Avx512Vnni => Panel::Vnni256 {
                evex: !Isa::AvxVnni.available(),
            },
            Isa::AvxVnni => Panel::Vnni256 { evex: false },
            Isa::Avx2 => Panel::Avx2,
            Isa::Portable => Panel::Portable,
        }
    }

    /// The kernel every quantized matmul of this process uses: the best that passes the
    /// check at or below the [`set_cap`] cap, chosen on first use.
    pub fn selected() -> Isa {
        *SELECTED.get_or_init(|| choose(CAP.get().copied()))
    }
}

/// A kernel over one panel, as [`super::QuantMatrix`] runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Panel {
    /// 256-bit `vpdpbusd`: VEX (AVX-VNNI) or EVEX (AVX-512 VNNI + VL) encoded.
    Vnni256 {
        evex: bool,
    },
    Avx2,
    Portable,
}

impl Panel {
    /// Every one-panel kernel this CPU has (both encodings where it has both): what the
    /// differential tests run.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Panel> {
        let mut have = Vec::new();
        if Isa::AvxVnni.available() {
            have.push(Panel::Vnni256 { evex: false });
        }
        if Isa::Avx512Vnni.available() {
            have.push(Panel::Vnni256 { evex: true });
        }
        if Isa::Avx2.available() {
            have.push(Panel::Avx2);
        }
        have.push(Panel::Portable);
        have
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Caps the process's choice at `cap` (`--cpu-kernels`, for comparing kernels on one
/// machine), and the float kernels at the width a CPU whose best set is `cap` has
/// ([`crate::kernels::width`]); call before the first matmul. Errors when the CPU lacks
/// `cap`, or when the kernels were already chosen.
pub fn set_cap(cap: Isa) -> Result<(), String> {
    if !cap.available() {
        let have: Vec<_> = ALL
            .iter()
            .filter(|i| i.available())
            .map(|i| i.name())
            .collect();
        return Err(format!(
            "--cpu-kernels {cap}: this CPU lacks its instructions; it has {}",
            have.join(", ")
        ));
    }
    if CAP.get() == Some(&cap) {
        return Ok(());
    }
    if SELECTED.get().is_some() || CAP.set(cap).is_err() {
        return Err("--cpu-kernels: the kernels were already chosen".into());
    }
    crate::kernels::width::set_cap(cap)
}

/// The best available kernel at or below `cap` that passes [`self_check`].
fn choose(cap: Option<Isa>) -> Isa {
    let start = cap.map_or(0, |c| ALL.iter().position(|i| *i == c).unwrap_or(0));
    for isa in ALL[start..].iter().copied().filter(|i| i.available()) {
        match self_check(isa) {
            Ok(()) => {
                tracing::info!(kernels = isa.name(), "quantized matmul kernels chosen");
                return isa;
            }
            Err(e) => {
                tracing::warn!(error = %e, "skipping a quantized kernel that failed its start-up check")
            }
        }
    }
    Isa::Portable
}

/// Runs `isa` against the portable kernel on every format, for one row (the GEMV of a
/// decode step, one-panel kernels), for five (a batch: the pair kernels, a lone last
/// panel, a partial panel and a partial row tile) and for 19 (AMX: a full tile of 16 rows
/// and a partial one).
pub fn self_check(isa: Isa) -> Result<(), SelfCheckError> {
    if isa == Isa::Portable {
        return Ok(());
    }
    let (n, k) = (36, 96);
    let val =
        |i: usize, mul: usize, md: usize| ((i * mul % md) as f32 - (md / 2) as f32) / md as f32;
    let w: Vec<f32> = (0..n * k).map(|i| val(i, 5, 11)).collect();
    let row = |o: usize, b: usize| &w[o * k + b * QK..o * k + (b + 1) * QK];
    let matrices = [
        QuantMatrix::from_q8(n, k, |o, b| Q8Block::quantize(row(o, b))),
        QuantMatrix::from_q4(n, k, |o, b| Q4Block::quantize_q4_1(row(o, b))),
        QuantMatrix::from_q4_0(n, k, |o, b| Q4Block::quantize_q4_0(row(o, b))),
    ];
    for m in [1, 5, 19] {
        let x: Vec<f32> = (0..m * k).map(|i| val(i, 7, 13)).collect();
        let xq = QuantRows::quantize(&x, m, k);
        for mat in &matrices {
            compare(isa, mat, &xq, m)?;
        }
    }
    Ok(())
}

/// `isa` against the portable kernel on one matrix and `m` quantized rows.
fn compare(isa: Isa, mat: &QuantMatrix, xq: &QuantRows, m: usize) -> Result<(), SelfCheckError> {
    let (mut got, mut want) = (vec![0f32; m * mat.n()], vec![0f32; m * mat.n()]);
    mat.matmul_quantized(isa, xq, m, &mut got);
    mat.matmul_quantized(Isa::Portable, xq, m, &mut want);
    // NaN counts as a mismatch.
    let bad = got
        .iter()
        .zip(&want)
        .position(|(g, w)| (g - w).abs().is_nan() || (g - w).abs() > 1e-4 * (1.0 + w.abs()));
    match bad {
        None => Ok(()),
        Some(at) => Err(SelfCheckError {
            isa,
            fmt: mat.format(),
            m,
            n: mat.n(),
            k: mat.k(),
            at,
            got: got[at],
            want: want[at],
        }),
    }
}
