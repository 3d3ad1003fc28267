//! CUDA releases and the NVIDIA drivers they need: what the bridge's
//! pre-flight check judges a job's CUDA requirement by, and what the agent
//! checks its GPU build's CUDA against at start. One table, here at the
//! bottom of the crate graph, so both read the same figures.

/// A CUDA release and the minimum Linux x86_64 driver of its GA build.
#[derive(Debug, Clone, Copy)]
pub struct CudaRelease {
    pub major: u32,
    pub minor: u32,
    pub min_driver: &'static str,
}

const fn cuda(major: u32, minor: u32, min_driver: &'static str) -> CudaRelease {
    CudaRelease {
        major,
        minor,
        min_driver,
    }
}

/// Source: NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding
/// Driver Versions" (Linux x86_64, the GA row of each release;
/// docs.nvidia.com/cuda/cuda-toolkit-release-notes, archived per release).
/// 11.0's GA row is 450.51.05 and 11.1's is 455.23; the often-quoted 450.80.02
/// is 11.x's minor-version-compatibility minimum and 455.32 is 11.1 Update 1.
/// There was no 12.7 release.
pub const CUDA_RELEASES: &[CudaRelease] = &[
    cuda(10, 0, "410.48"),
    cuda(10, 1, "418.39"),
    cuda(10, 2, "440.33"),
    cuda(11, 0, "450.51.05"),
    cuda(11, 1, "455.23"),
    cuda(11, 2, "460.27.03"),
    cuda(11, 3, "465.19.01"),
    cuda(11, 4, "470.42.01"),
    cuda(11, 5, "495.29.05"),
    cuda(11, 6, "510.39.01"),
    cuda(11, 7, "515.43.04"),
    cuda(11, 8, "520.61.05"),
    cuda(12, 0, "525.60.13"),
    cuda(12, 1, "530.30.02"),
    cuda(12, 2, "535.54.03"),
    cuda(12, 3, "545.23.06"),
    cuda(12, 4, "550.54.14"),
    cuda(12, 5, "555.42.02"),
    cuda(12, 6, "560.28.03"),
    cuda(12, 8, "570.26"),
    cuda(12, 9, "575.51.03"),
    cuda(13, 0, "580.65.06"),
];

/// Source: the same release notes, "CUDA Toolkit and Minimum Required Driver
/// Version for CUDA Minor Version Compatibility". Only used to explain a
/// refusal, never to pass a job (see the module docs).
pub const MINOR_VERSION_COMPAT: &[(u32, &str)] =
    &[(11, "450.80.02"), (12, "525.60.13"), (13, "580.65.06")];

/// The CUDA major version the GPU build of ONNX Runtime that
/// `scripts/fetch-onnxruntime.sh --gpu` installs was built against.
pub const GPU_BUILD_CUDA_MAJOR: u32 = 13;

/// The oldest driver that runs CUDA `major` at all (minor-version
/// compatibility), if the table has the major.
pub fn min_driver_for_major(major: u32) -> Option<&'static str> {
    MINOR_VERSION_COMPAT
        .iter()
        .find(|(m, _)| *m == major)
        .map(|(_, driver)| *driver)
}

/// Whether the dotted version `driver` (`535.104.05`) is at least `min`,
/// numerically part by part; `None` for a driver that is not a version.
pub fn driver_at_least(driver: &str, min: &str) -> Option<bool> {
    let parts =
        |v: &str| -> Option<Vec<u32>> { v.trim().split('.').map(|p| p.parse().ok()).collect() };
    let (driver, min) = (parts(driver)?, parts(min)?);
    Some(driver >= min)
}

/// Why the GPU build cannot run on a machine with `driver`, or `None` when
/// it can (or no driver was found to judge: ONNX Runtime then says why).
pub fn gpu_build_driver_problem(driver: Option<&str>) -> Option<String> {
    let driver = driver?;
    let min = min_driver_for_major(GPU_BUILD_CUDA_MAJOR)?;
    match driver_at_least(driver, min) {
        Some(true) => None,
        Some(false) => Some(format!(
            "NVIDIA driver {driver} is older than {min}, the oldest that runs CUDA \
             {GPU_BUILD_CUDA_MAJOR} (this ONNX Runtime GPU build's): upgrade the driver, or \
             serve on the CPU"
        )),
        None => Some(format!("NVIDIA driver version {driver:?} is not a version")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_builds_driver_is_checked_and_named() {
        for (driver, problem) in [
            (Some("580.65.06"), false),
            (Some("580.95.05"), false),
            (Some("590.1"), false),
            (Some("580.65.05"), true),
            (Some("575.51.03"), true),
            (Some("535.104.05"), true),
            (Some("garbage"), true),
            (None, false),
        ] {
            let got = gpu_build_driver_problem(driver);
            assert_eq!(got.is_some(), problem, "{driver:?}: {got:?}");
            if let (Some(why), Some(d)) = (got, driver) {
                assert!(why.contains(d), "{why}");
            }
        }
        let why = gpu_build_driver_problem(Some("535.104.05")).unwrap();
        assert!(
            why.contains("580.65.06") && why.contains("CUDA 13"),
            "{why}"
        );
    }

    #[test]
    fn driver_versions_compare_by_number() {
        assert_eq!(driver_at_least("580.100", "580.65.06"), Some(true));
        assert_eq!(driver_at_least("580.65", "580.65.06"), Some(false));
        assert_eq!(driver_at_least("1000", "580"), Some(true));
        assert_eq!(driver_at_least("x.1", "580"), None);
    }
}
