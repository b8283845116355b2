# Type stubs of the dlcp package. The Client options between the markers come from the option
# table (tests/python/test_binding.py checks them; DLCP_UPDATE_DOCS=1 rewrites them).
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Union

from .errors import *  # noqa: F401,F403
from .errors import Error as Error

__version__: str

Stats = Dict[str, Any]
Callback = Callable[[Optional[Stats], Optional[str]], None]
Tensor = Any  # a torch tensor, a numpy array or any writable float32 buffer

def cuda_status() -> Optional[str]: ...
def default_client() -> Client: ...
def resolve_aggregators(service: str) -> str: ...
def set_log_level(level: Union[str, int]) -> None: ...

class Handle:
    def done(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> Stats: ...

class HostStage(NamedTuple):
    formed: bool
    ranks: List[int]
    local_rank: int
    local_size: int
    pushes: bool
    whole_job: bool
    why_not: str

class Client:
    def __init__(
        self,
        *,
        # BEGIN OPTIONS
        aggregators: str,
        job: str = '',
        world_size: int,
        rank: int,
        plaintext: bool = False,
        tls_ca: str = '',
        tls_cert: str = '',
        tls_key: str = '',
        tls_server_name: str = '',
        rpc_timeout_ms: int = 5000,
        heartbeat_interval_ms: int = 1000,
        on_aggregator_loss: str = 'remap',
        host_stage: bool = True,
        host_socket: str = '/run/dlcp/dlcpd.sock',
        local_size: int = 0,
        chunk_bytes: int = 0,
        op_timeout_ms: int = 60000,
        repair_timeout_ms: int = 5,
        window_bytes: int = 4194304,
        adaptive_window: bool = True,
        path_steering: bool = True,
        nack_filter: bool = True,
        congestion_delay_us: int = 700,
        pacing: bool = True,
        payload_encoding: str = 'f32',
        timeline: str = '',
        loss_bound: float = 0.0,
        class_policy: str = 'magnitude-layer',
        reliable_fraction: float = 0.1,
        rank_reliable: bool = False,
        num_layers: int = 0,
        compensation: str = 'rescale',
        error_feedback: bool = True,
        pull_mode: str = 'consistent',
        pull_loss_bound: float = -1.0,
        phase_aware: bool = False,
        inject_drop_class: str = '',
        inject_burst: int = 1,
        inject_seed: int = 1,
        transport: str = 'auto',
        data_host: str = '',
        bind_host: str = '0.0.0.0',
        dscp: str = '46,34,18,0',
        busy_poll: bool = False,
        udp_offload: str = 'true',
        spray_ports: int = 16,
        spray_burst: int = 0,
        rdma_device: str = '',
        rdma_port: int = 1,
        rdma_gid_index: int = -1,
        rdma_qkey: int = 219938817,
        rdma_recv_slots: int = 4096,
        # END OPTIONS
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def job_id(self) -> int: ...
    @property
    def job(self) -> str: ...
    @property
    def host_stage(self) -> HostStage: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    def rejects(self) -> Dict[str, int]: ...
    def rx_overflows(self) -> int: ...
    def rx_queue_ran_dry(self) -> int: ...
    def port_counters(self) -> Dict[str, int]: ...
    def allreduce_async(self, key: int, tensor: Tensor, *, layer: int = 0, loss_bound: Optional[float] = None,
                        callback: Optional[Callback] = None, encoding: Optional[str] = None,
                        report_classes: bool = False, name: str = "") -> Handle: ...
    def allreduce(self, key: int, tensor: Tensor, *, layer: int = 0, loss_bound: Optional[float] = None,
                  timeout: Optional[float] = None, encoding: Optional[str] = None, report_classes: bool = False,
                  name: str = "") -> Stats: ...
    def broadcast_async(self, key: int, tensor: Tensor, root: int, *, callback: Optional[Callback] = None) -> Handle: ...
    def broadcast(self, key: int, tensor: Tensor, root: int, *, timeout: Optional[float] = None) -> Stats: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: Any) -> None: ...
